"""OpenAI request bodies (pydantic, strict types) and the OpenAI error body.

Types are checked strictly (a string where a number belongs is a 400); value ranges are checked by
SamplingParams, whose ValueError names the field. Unknown fields are ignored, as OpenAI does.
"""
from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Base(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data: Any) -> Any:
        """`"stream": null` is the default, as OpenAI's nullable fields and vLLM's Optional ones
        are: clients that serialise unset fields as null must not get a 400."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or k not in fields or _nullable(fields[k].annotation)}


def _nullable(annotation: Any) -> bool:
    return annotation is Any or type(None) in get_args(annotation)


class StreamOptions(_Base):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(_Base):
    """Fields shared by completions and chat (OpenAI's, then vLLM's extensions)."""
    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False  # add token ids (prompt and output) to the response
    prompt_logprobs: int | None = None  # logprobs of the prompt tokens (vLLM's format; not with stream)
    kv_transfer_params: dict[str, Any] | None = None  # prefill/decode hand-over (vLLM's; tokenmill/disagg)
    # structured outputs (OpenAI's response_format; vLLM's structured_outputs and guided_*)
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ContentPart(_Base):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None


class ToolCallFunction(_Base):
    model_config = ConfigDict(strict=True, extra="allow")
    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCall(_Base):
    """A call in an assistant message's `tool_calls` (typed: the chat template and the tool
    fallback index into it)."""
    model_config = ConfigDict(strict=True, extra="allow")
    id: str | None = None
    type: str = "function"
    function: ToolCallFunction


class ChatMessage(_Base):
    model_config = ConfigDict(strict=True, extra="allow")
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    # vLLM extensions
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeRequest(_Base):
    """vLLM's POST /tokenize: a text prompt, or chat messages through the chat template."""
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Base):
    model: str | None = None
    tokens: list[int]


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
