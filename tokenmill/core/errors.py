"""Failures the core recovers from (torch-free)."""
from __future__ import annotations


class RequestStepError(RuntimeError):
    """An executor failed a step because of these requests only. The core ends them with
    FinishReason.ERROR (freeing their blocks) and treats the step as not run for the others, which
    are scheduled again from where they were; any other exception from an executor is fatal."""

    def __init__(self, request_ids: list[str], message: str) -> None:
        super().__init__(message)
        self.request_ids = list(request_ids)
