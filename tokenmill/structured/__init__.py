"""Grammar-constrained decoding on llguidance, and tool-call parsing.

backend.py: constraints -> llguidance grammars, compiled once per grammar and cached (frontend
and runner share the cache); matcher.py: each request's grammar state in the runner; bitmask.py:
the allowed-token bitmask and its application to the logits; tools.py / tool_parser.py: tool
definitions -> prompt and grammar, and model output -> tool calls.
"""
