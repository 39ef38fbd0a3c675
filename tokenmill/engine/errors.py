"""Why the async engine refused or ended a request (the server maps each to an HTTP status)."""
from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an error; nothing more will be served."""


class EngineShutdownError(RuntimeError):
    """The engine is shutting down; the request was refused or aborted."""


class QueueFullError(RuntimeError):
    """Too many requests are waiting; try again later."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestFailedError(RuntimeError):
    """One request failed inside the engine (FinishReason.ERROR); the engine serves the others."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"request {request_id} failed inside the engine step")
        self.request_id = request_id


class RequestAbortedError(RuntimeError):
    """The request was aborted on request (e.g. a fleet billing a request its client abandoned)."""


class EngineSleepingError(RuntimeError):
    """The engine sleeps (sleep mode: its KV cache is released) until it is woken up."""
