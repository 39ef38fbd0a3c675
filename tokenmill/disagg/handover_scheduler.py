"""The scheduler half shared by the shm and nixl connectors (torch-free: it sees requests and block
ids; what moves the bytes is the worker half, tokenmill/disagg/workers.py).

Prefill side: a request with {"do_remote_decode": true} is saved in the step that completes its
prompt (a SaveSpec: the KV of every prompt token); at finish its blocks stay held (delayed
freeing) until the worker reports that the receiver acknowledged them or the timeout passed, and
its output carries the transfer parameters, with the first token it sampled.

Decode side: a request with {"do_remote_prefill": true, ...} is checked against its own prompt
(same tokens, same model and KV layout); the tokens past the local prefix-cache hit arrive
remotely: the request waits in `waiting_for_remote_kv` while the worker copies them, then adopts
the prefill engine's first token and decodes from there. So it runs exactly the computation of
a colocated engine (the whole prompt in the prefill's chunks, then one decode step per token),
not a recomputed last prompt token whose logits could differ in the last bits and flip a greedy
near-tie. A request whose load failed, or whose parameters do not fit, computes its prompt
locally (a recompute, counted by reason). A request asking for logprobs is not handed over (the
first token's logprobs stay on the prefill engine).
"""
from __future__ import annotations

import hashlib
from typing import Any

from tokenmill.disagg.connector import KVConnectorMetadata, KVConnectorOutput, KVTransferStats, LoadSpec, SaveSpec, transfer_params
from tokenmill.request import FinishReason, Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def prompt_hash(token_ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:32]


class HandoverConnectorScheduler:
    def __init__(self, block_size: int, hash_key: str, timeout_s: float, vocab_size: int | None = None) -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.hash_key = hash_key
        self.timeout_s = timeout_s
        self._loads: list[LoadSpec] = []
        self._decided: set[str] = set()  # receiving requests whose transfer was planned or refused
        self._saving: set[str] = set()  # sending requests whose save is scheduled
        self._saved: dict[str, dict[str, Any] | None] = {}  # request id -> the worker's parameters
        self._stats = KVTransferStats()

    # -- receiving ------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        params = transfer_params(request)
        rid = request.request_id
        if not params or not params.get("do_remote_prefill") or rid in self._decided:
            return 0
        reason = self._unusable(request, params)
        if reason is not None:
            self._decided.add(rid)
            self._count_recompute(reason)
            self._loads.append(LoadSpec(rid, params, [], 0, ack_only=True))  # the sender may free now
            return 0
        remote = int(params["num_tokens"]) - num_computed_tokens
        if remote <= 0:  # the local prefix cache has it all
            self._decided.add(rid)
            self._loads.append(LoadSpec(rid, params, [], 0, ack_only=True))
            return 0
        return remote

    def _unusable(self, request: Request, params: dict[str, Any]) -> str | None:
        needed = ("num_tokens", "remote_block_ids", "transfer_id", "block_checksums",  # + the worker half's own
                  "prompt_hash", "hash_key", "block_size", "first_token_id")
        if any(k not in params for k in needed):
            return "bad_params"
        first = params["first_token_id"]  # it enters the model's next step: it must be a token
        if not isinstance(first, int) or isinstance(first, bool) or first < 0 or (
                self.vocab_size is not None and first >= self.vocab_size):
            return "bad_params"
        if params["hash_key"] != self.hash_key or params["block_size"] != self.block_size:
            return "layout_mismatch"
        if (params["prompt_hash"] != prompt_hash(request.prompt_token_ids)
                or params["num_tokens"] != request.num_prompt_tokens or request.num_output_tokens):
            return "prompt_mismatch"
        if request.params.prompt_logprobs is not None or request.params.logprobs is not None:
            return "logprobs"  # the logits of the prompt or of the first token are on the prefill engine
        return None

    def update_state_after_alloc(self, request: Request, block_ids: list[int], num_computed_tokens: int,
                                 num_external_tokens: int) -> None:
        first = num_computed_tokens // self.block_size
        last = cdiv(num_computed_tokens + num_external_tokens, self.block_size)
        self._loads.append(LoadSpec(request.request_id, transfer_params(request), list(block_ids[first:last]), first))
        self._decided.add(request.request_id)

    def request_failed_load(self, request: Request, reason: str) -> None:
        self._count_recompute(reason)

    def _count_recompute(self, reason: str) -> None:
        self._stats.recomputes[reason] = self._stats.recomputes.get(reason, 0) + 1

    # -- sending --------------------------------------------------------------------------------
    def build_connector_meta(self, scheduled: dict[str, int], requests: dict[str, Request],
                             block_ids: dict[str, list[int]]) -> KVConnectorMetadata | None:
        meta = KVConnectorMetadata(loads=self._loads)
        self._loads = []
        for rid, n in scheduled.items():
            req = requests[rid]
            params = transfer_params(req)
            if not params or not params.get("do_remote_decode") or rid in self._saving:
                continue
            num_tokens = req.num_prompt_tokens
            if req.num_computed_tokens + n < num_tokens:
                continue
            timeout = min(float(params.get("timeout_s", self.timeout_s)), self.timeout_s)
            meta.saves.append(SaveSpec(rid, list(block_ids[rid][:cdiv(num_tokens, self.block_size)]),
                                       num_tokens, timeout))
            self._saving.add(rid)
        return None if meta.is_empty else meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._decided.discard(rid)
        self._saving.discard(rid)
        saved = self._saved.pop(rid, None)
        if saved is None:  # never saved (aborted first) or the save failed
            return False, None
        if request.finish_reason in (FinishReason.ABORT, FinishReason.ERROR) or not request.num_output_tokens:
            return True, None  # nobody will come for it: held until the timeout releases it
        out = dict(saved)
        out.update(do_remote_prefill=True, num_tokens=request.num_prompt_tokens,
                   first_token_id=request.output_token_ids[0],
                   prompt_hash=prompt_hash(request.prompt_token_ids), hash_key=self.hash_key,
                   block_size=self.block_size)
        return True, out

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        for rid, params in output.saved.items():
            self._saved[rid] = params
            if params is None:
                self._stats.sends["failed"] = self._stats.sends.get("failed", 0) + 1
        for outcome in output.finished_sending.values():
            self._stats.sends[outcome] = self._stats.sends.get(outcome, 0) + 1
        self._stats.received.extend(output.finished_recving.values())

    def has_pending_work(self) -> bool:
        return bool(self._loads)

    def take_stats(self) -> KVTransferStats | None:
        st = self._stats
        if not (st.received or st.recomputes or st.sends):
            return None
        self._stats = KVTransferStats()
        return st
