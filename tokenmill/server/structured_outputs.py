"""The request's constraint on the output -> StructuredOutputsParams.

Sources (at most one per request): OpenAI's `response_format` (`json_object`, `json_schema`),
vLLM's `structured_outputs` ({json | regex | choice | grammar | json_object, ...}) and vLLM's older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` (+ `guided_whitespace_pattern`).
A constraint the engine cannot compile is refused later, by the engine, naming the same field.
"""
from __future__ import annotations

from typing import Any

from tokenmill.sampling_params import StructuredOutputsParams
from tokenmill.server.errors import APIError
from tokenmill.server.protocol import ChatCompletionRequest, CompletionRequest

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace", "whitespace_pattern")


def structured_outputs_of(req: CompletionRequest | ChatCompletionRequest) -> tuple[StructuredOutputsParams | None,
                                                                                     str | None]:
    """The constraint and the request field it came from (None, None when unconstrained)."""
    found: list[tuple[str, dict[str, Any]]] = []
    if req.response_format is not None:
        kwargs = _response_format(req.response_format)
        if kwargs is not None:
            found.append(("response_format", kwargs))
    if req.structured_outputs is not None:
        unknown = sorted(set(req.structured_outputs) - set(_FIELDS))
        if unknown:
            raise APIError(400, f"structured_outputs: unsupported field(s) {', '.join(unknown)}",
                           param="structured_outputs")
        found.append(("structured_outputs", dict(req.structured_outputs)))
    for name, field in _GUIDED.items():
        if getattr(req, name) is not None:
            kwargs = {field: getattr(req, name)}
            if req.guided_whitespace_pattern is not None:
                kwargs["whitespace_pattern"] = req.guided_whitespace_pattern
            found.append((name, kwargs))
    if not found:
        return None, None
    if len(found) > 1:
        raise APIError(400, f"at most one output constraint per request, got {', '.join(n for n, _ in found)}",
                       param=found[1][0])
    param, kwargs = found[0]
    try:
        return StructuredOutputsParams(**kwargs), param
    except (TypeError, ValueError) as e:
        raise APIError(400, f"{param}: {e}", param=param) from None


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(400, 'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}',
                           param="response_format")
        return {"json": schema}
    raise APIError(400, f"response_format type must be text, json_object or json_schema, got {kind!r}",
                   param="response_format")
