"""The KV connector seam (vLLM v1's design in fewer hooks), torch-free.

Two halves, one per side of the SchedulerOutput:

- `KVConnectorScheduler` lives beside the Scheduler (plain data only). It says how many of a
  request's tokens will arrive from another engine (`get_num_new_matched_tokens`), learns which
  blocks were allocated for them (`update_state_after_alloc`; the request then waits in the
  scheduler's `waiting_for_remote_kv` state), puts this step's loads and saves into the
  SchedulerOutput (`build_connector_meta`), decides at finish whether the sender must keep a
  request's blocks until the receiver has them (`request_finished`: delayed freeing), and reads the
  worker's reports (`update_connector_output`).
- `KVConnectorWorker` lives beside the model runner (it touches the KV tensors): it starts and
  finishes loads before the forward (`start_load_kv`), saves after it (`save_kv`), and reports what
  finished (`get_finished` -> KVConnectorOutput): loads done or failed (a failed load makes the
  scheduler recompute the prompt locally), saves made, sends the receiver confirmed or that timed
  out (their blocks may be freed now).

Requests name their role in `SamplingParams.kv_transfer_params` (vLLM's field):
  {"do_remote_decode": true}  on the prefill engine: prefill, then hand the KV over; the finished
                              output carries the parameters the decode engine needs.
  {"do_remote_prefill": true, ...those parameters...}  on the decode engine: load, then decode.
`NullKVConnector` is what an engine without a connector (role both, the simulator) runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from tokenmill.request import Request

ROLES = ("prefill", "decode", "both")


@dataclass(frozen=True)
class LoadSpec:
    """Copy remote blocks into local ones (ack_only: nothing to copy, the local prefix cache had
    every block; just tell the sender it may free)."""
    request_id: str
    params: dict[str, Any]  # the sender's transfer parameters
    local_block_ids: list[int]
    first_block: int  # index of the first transferred block in the request's block list
    ack_only: bool = False


@dataclass(frozen=True)
class SaveSpec:
    """Publish a request's first num_tokens tokens of KV after this step's forward has written them."""
    request_id: str
    block_ids: list[int]
    num_tokens: int
    timeout_s: float


@dataclass
class KVConnectorMetadata:
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.loads or self.saves)


@dataclass(frozen=True)
class TransferRecord:
    """One finished transfer as the receiver saw it."""
    request_id: str
    num_tokens: int
    num_bytes: int
    seconds: float


@dataclass
class KVConnectorOutput:
    """What the worker half reports after a step."""
    finished_recving: dict[str, TransferRecord] = field(default_factory=dict)
    failed_recving: dict[str, str] = field(default_factory=dict)  # request id -> reason
    saved: dict[str, dict[str, Any]] = field(default_factory=dict)  # request id -> transfer parameters
    finished_sending: dict[str, str] = field(default_factory=dict)  # request id -> "acked" | "timeout"

    @property
    def is_empty(self) -> bool:
        return not (self.finished_recving or self.failed_recving or self.saved or self.finished_sending)


@dataclass
class KVTransferStats:
    """Per step, for the stat loggers."""
    received: list[TransferRecord] = field(default_factory=list)
    recomputes: dict[str, int] = field(default_factory=dict)  # reason -> count
    sends: dict[str, int] = field(default_factory=dict)  # "acked" | "timeout" | "failed" -> count


class KVConnectorScheduler(Protocol):
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int: ...

    def update_state_after_alloc(self, request: Request, block_ids: list[int], num_computed_tokens: int,
                                 num_external_tokens: int) -> None: ...

    def build_connector_meta(self, scheduled: dict[str, int], requests: dict[str, Request],
                             block_ids: dict[str, list[int]]) -> KVConnectorMetadata | None: ...

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]: ...

    def update_connector_output(self, output: KVConnectorOutput) -> None: ...

    def request_failed_load(self, request: Request, reason: str) -> None: ...

    def has_pending_work(self) -> bool: ...

    def take_stats(self) -> KVTransferStats | None: ...


class KVConnectorWorker(Protocol):
    def start_load_kv(self, metadata: KVConnectorMetadata | None) -> None: ...

    def save_kv(self, metadata: KVConnectorMetadata | None) -> None: ...

    def get_finished(self) -> KVConnectorOutput: ...

    def close(self) -> None: ...


class NullKVConnector:
    """No transfers: every hook is a no-op (role both, the simulator)."""

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        return 0

    def update_state_after_alloc(self, request: Request, block_ids: list[int], num_computed_tokens: int,
                                 num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduled, requests, block_ids) -> KVConnectorMetadata | None:
        return None

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        pass

    def request_failed_load(self, request: Request, reason: str) -> None:
        pass

    def has_pending_work(self) -> bool:
        return False

    def take_stats(self) -> KVTransferStats | None:
        return None


def transfer_params(request: Request) -> dict[str, Any] | None:
    return getattr(request.params, "kv_transfer_params", None)
