"""GuardMiddleware: request id echo, the header cap (431), the API key (every route but /health and /ping, and
/metrics with public_metrics), the draining 503 on /v1, the full-queue 429 on the generation routes
(shed before the body is parsed: under overload a refusal must cost the engine thread, which shares
the GIL with this loop, as little as possible; its bytes are only read and dropped, up to the body
cap, so the client gets the answer rather than a reset) and the request-body cap (413).

Pure ASGI rather than Starlette's BaseHTTPMiddleware: it never buffers responses, so SSE streams
pass straight through.
"""
from __future__ import annotations

import hashlib
import hmac
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenmill.engine.errors import QueueFullError
from tokenmill.server.errors import APIError, engine_error, send_error
from tokenmill.server.state import ServerState

_BODY_METHODS = {"POST", "PUT", "PATCH"}
_OPEN_PATHS = frozenset({"/health", "/ping"})
_GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


class GuardMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_headers = scope.get("headers", [])
        if _header_bytes(scope, raw_headers) > self.state.max_request_header_bytes:
            cap = self.state.max_request_header_bytes
            await send_error(send, APIError(431, f"request line and headers exceed {cap} bytes",
                                            code="request_header_fields_too_large"), close=True)
            return
        headers = {k.lower(): v for k, v in raw_headers}
        rid = headers.get(b"x-request-id") or uuid.uuid4().hex.encode()
        if len(rid) > 128 or not rid.isascii():
            rid = uuid.uuid4().hex.encode()  # never echo an arbitrary blob back
        scope.setdefault("state", {})["request_id"] = rid.decode("latin-1")
        send = _with_request_id(send, rid)
        err = self._refusal(scope["path"], headers)
        has_body = scope.get("method") in _BODY_METHODS
        if err is not None:
            if has_body:  # a stranger's body costs us no more than an accepted one may
                await _drop_body(receive, headers, limit=self.state.max_request_body_bytes)
            await send_error(send, err)
            return
        if has_body:
            await self._with_capped_body(scope, receive, send, headers)
            return
        await self.app(scope, receive, send)

    def _refusal(self, path: str, headers: dict[bytes, bytes]) -> APIError | None:
        st = self.state
        if st.api_key is not None and not self._open(path) and not _authorized(headers.get(b"authorization"),
                                                                              st.api_key):
            return APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                            "invalid_request_error", None, "invalid_api_key", {"WWW-Authenticate": "Bearer"})
        if st.draining and path.startswith("/v1"):
            return st.unavailable()
        if path in _GENERATION_PATHS and st.engine is not None:
            try:
                st.engine.check_capacity()
            except QueueFullError as e:
                return engine_error(e)
        return None

    def _open(self, path: str) -> bool:
        return path in _OPEN_PATHS or (self.state.public_metrics and path == "/metrics")

    async def _with_capped_body(self, scope: Scope, receive: Receive, send: Send,
                                headers: dict[bytes, bytes]) -> None:
        """Read the whole body (413 past the cap), then run the app with it replayed."""
        cap = self.state.max_request_body_bytes
        too_big = APIError(413, f"request body exceeds {cap} bytes", "invalid_request_error", None,
                           "request_too_large")
        length = headers.get(b"content-length")
        try:
            if length is not None and int(length) > cap:
                await _drop_body(receive, headers)
                await send_error(send, too_big, close=True)
                return
        except ValueError:
            await send_error(send, APIError(400, "invalid Content-Length", code="invalid_content_length"),
                             close=True)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > cap:
                if message.get("more_body", False):
                    await _drop_body(receive, headers, size)
                await send_error(send, too_big, close=True)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def receive_replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, receive_replayed, send)


# Bytes of a refused request's body read and dropped before the answer; past this the connection
# is closed with the rest unread (and the client may see a reset instead of the answer).
_DROP_LIMIT = 32 * 2**20


async def _drop_body(receive: Receive, headers: dict[bytes, bytes], received: int = 0,
                     limit: int = _DROP_LIMIT) -> None:
    """Read the rest of a body nobody will use (up to `limit` bytes). Closing a connection whose
    request still has bytes unread makes the kernel reset it, and a keep-alive client then gets
    "connection reset" instead of our 413/429. A client that waits for "100 Continue" has sent
    nothing: left alone."""
    if headers.get(b"expect", b"").lower() == b"100-continue":
        return
    while received <= limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        received += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _with_request_id(send: Send, rid: bytes) -> Send:
    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*(h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"),
                                  (b"x-request-id", rid)]
        await send(message)

    return send_with_id


def _header_bytes(scope: Scope, headers: list[tuple[bytes, bytes]]) -> int:
    """The request line and headers as they came on the wire (about: ': ' and CRLF per header)."""
    line = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 16
    return line + sum(len(k) + len(v) + 4 for k, v in headers)


def _authorized(header: bytes | None, key: str) -> bool:
    """Constant time in the key: both sides are hashed first, so neither the content nor the
    length of the key can be learnt from the time a refusal takes."""
    if not header:
        return False
    given = hashlib.sha256(header.strip()).digest()
    expected = hashlib.sha256(f"Bearer {key}".encode()).digest()
    return hmac.compare_digest(given, expected)
