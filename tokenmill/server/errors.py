"""OpenAI error bodies: `APIError`, the engine-exception mapping, and the app's exception handlers.

Every error the server answers is {"error": {message, type, param, code}}; `code` is a string (or
null), as in the OpenAI API.
"""
from __future__ import annotations

import json
import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Send

from tokenmill.engine.errors import (EngineDeadError, EngineShutdownError, EngineSleepingError, QueueFullError,
                                     RequestFailedError)
from tokenmill.server.protocol import error_body

logger = logging.getLogger("tokenmill.server")

# The request field a SamplingParams/engine ValueError is about: its message starts with the name.
_PARAM_NAMES = {"n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                "repetition_penalty", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "stop", "seed",
                "stop_token_ids", "prompt", "prompt_token_ids", "request", "logit_bias", "allowed_token_ids", "bad_words"}
_PARAM_RENAMES = {"prompt_token_ids": "prompt", "request": "max_tokens"}  # "request needs up to N tokens"
_HTTP_CODES = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


class APIError(Exception):
    """An error answered with an OpenAI error body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def param_of(message: str, aliases: dict[str, str] | None = None) -> str | None:
    """The request field an engine or SamplingParams ValueError names (None if it names none)."""
    word = message.split(" ", 1)[0].strip(":,")
    if word not in _PARAM_NAMES:
        return None
    word = _PARAM_RENAMES.get(word, word)
    return (aliases or {}).get(word, word)


def aliased_message(message: str, aliases: dict[str, str] | None) -> str:
    """The message with its leading engine field name in the endpoint's words ("max_tokens must
    be ..." -> "max_completion_tokens must be ..." when the request used that field)."""
    word = message.split(" ", 1)[0]
    alias = (aliases or {}).get(word)
    return alias + message[len(word):] if alias else message


def engine_error(e: BaseException, aliases: dict[str, str] | None = None) -> APIError:
    """Map an engine exception to an APIError (never a 500 for a client's mistake); `aliases`
    renames engine field names to the endpoint's (e.g. prompt -> messages for chat)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, QueueFullError):
        return APIError(429, str(e), "rate_limit_error", None, "rate_limit_exceeded",
                        {"Retry-After": str(e.retry_after)})
    if isinstance(e, EngineDeadError):  # its message holds the loop's exception: for the log only
        return APIError(503, "the engine loop has died (details in the server log)", "service_unavailable", None,
                        "engine_dead")
    if isinstance(e, RequestFailedError):
        return APIError(500, f"request {e.request_id} failed inside the model step; other requests are unaffected "
                             "(details in the server log)", "server_error", None, "request_failed")
    if isinstance(e, EngineShutdownError):
        return APIError(503, str(e), "service_unavailable", None, "shutting_down")
    if isinstance(e, EngineSleepingError):
        return APIError(503, str(e), "service_unavailable", None, "engine_sleeping", {"Retry-After": "1"})
    if isinstance(e, ValueError):
        param = getattr(e, "param", None)  # RequestValidationError names its field
        param = (aliases or {}).get(param, param) if param else param_of(str(e), aliases)
        code = "context_length_exceeded" if "maximum context length" in str(e) else None
        return APIError(400, aliased_message(str(e), aliases), param=param, code=code)
    logger.error("unexpected engine error", exc_info=e)
    # never the message or traceback: they may name files or quote the request
    return APIError(500, f"internal error ({type(e).__name__}); details in the server log", "server_error",
                    None, "internal_error")


def validation_error(e: ValidationError | RequestValidationError) -> APIError:
    """A pydantic error on the request body -> 400 naming the first bad field."""
    errors = e.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
    if first.get("type") == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}",
                        code="invalid_json")
    param = loc[0] if loc else None
    where = ".".join(loc) or "body"
    return APIError(400, f"{where}: {first.get('msg', 'invalid value')}", param=param, code="invalid_value")


async def send_error(send: Send, err: APIError, close: bool = False) -> None:
    """Answer with `err` straight on the ASGI channel (for the middleware, outside any route)."""
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (err.headers or {}).items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def add_exception_handlers(app: FastAPI) -> None:
    """Every error, including FastAPI's own 404/405 and unexpected ones, as an OpenAI body."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, e: RequestValidationError):
        return validation_error(e).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        kind, code = _HTTP_CODES.get(e.status_code, ("invalid_request_error", "http_error"))
        return JSONResponse(error_body(str(e.detail), kind, None, code), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):  # last resort: still an OpenAI body
        logger.exception("unexpected error on %s", request.url.path)
        return JSONResponse(error_body(f"internal error ({type(e).__name__}); details in the server log",
                                       "server_error", None, "internal_error"), status_code=500)
