"""The worker half of the shared-memory connector: it touches the KV tensors.

Sender (role prefill): the KV cache lives in a `KVRegion`. `save_kv`, after the forward that
completed a prompt, checksums the request's blocks, takes a lease on a control slot and returns
the transfer parameters (region name, block ids, transfer id, per-block crc32). The blocks stay
held (the scheduler half delays their freeing) until the receiver's ack or the timeout;
`get_finished` reports either, after clearing the lease.

Receiver (role decode): `start_load_kv` attaches the sender's region, checks the lease, copies the
blocks by id into its own, checks the lease again and every block's crc32, and acks. Any failure
(region gone, layout or lease or checksum mismatch) is reported, and the request recomputes its
prompt locally.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from tokenmill.disagg.connector import LoadSpec, SaveSpec
from tokenmill.disagg.worker_base import ConnectorWorkerBase
from tokenmill.disagg.shm_region import REGION_PREFIX, SLOTS, KVRegion, RemoteRegion, block_bytes_of, block_checksums, byte_rows, flat_tensors

logger = logging.getLogger(__name__)

MAX_ATTACHED_REGIONS = 16


class ShmConnectorWorker(ConnectorWorkerBase):
    def __init__(self, role: str, kv_caches: list, num_blocks: int, clock=time.monotonic) -> None:
        super().__init__()
        self.role = role
        self.num_blocks = num_blocks
        self.clock = clock
        self.region = KVRegion(kv_caches, num_blocks) if role == "prefill" else None
        self.kv_caches = self.region.kv_caches if self.region is not None else kv_caches
        tensors = flat_tensors(self.kv_caches)
        self.block_bytes = block_bytes_of(tensors, num_blocks)
        self.rows = self.region.rows if self.region is not None else [byte_rows(t, num_blocks) for t in tensors]
        self._attached: dict[str, RemoteRegion] = {}
        self._pending: dict[int, tuple[str, float]] = {}  # transfer id -> (request id, deadline)
        self._next_id = 1
        if self.region is not None:
            logger.info("KV cache shared for transfers in %s (%.1f MiB)", self.region.name,
                        self.region.shm.size / (1 << 20))

    # -- receiving ------------------------------------------------------------------------------
    def _load(self, load: LoadSpec) -> tuple[int, int] | None:
        p = load.params
        region = self._attach(p)
        slot, tid = int(p["transfer_id"]) % SLOTS, int(p["transfer_id"])
        if load.ack_only:
            region.ack[slot] = tid
            return None
        remote_ids = list(p["remote_block_ids"])[load.first_block:load.first_block + len(load.local_block_ids)]
        if len(remote_ids) != len(load.local_block_ids):
            raise _Failure("bad_params", f"{len(remote_ids)} remote blocks for {len(load.local_block_ids)} local")
        if region.lease[slot] != tid:
            raise _Failure("lease_expired", "the sender no longer holds these blocks")
        runs = block_runs(remote_ids, load.local_block_ids)
        for mine, theirs in zip(self.rows, region.rows):
            for s, d, n in runs:  # one memcpy per run of consecutive blocks on both sides
                mine[d:d + n].copy_(theirs[s:s + n])
        if region.lease[slot] != tid:  # released during the copy: the blocks may have been reused
            raise _Failure("lease_expired", "the sender released the blocks during the copy")
        region.ack[slot] = tid  # the sender may free them now, whatever our checksums say
        want = list(p["block_checksums"])[load.first_block:load.first_block + len(remote_ids)]
        if block_checksums(self.rows, load.local_block_ids) != want:
            raise _Failure("checksum_mismatch", "the copied blocks' crc32 differ from the sender's")
        num_tokens = int(p["num_tokens"])
        return num_tokens, len(remote_ids) * sum(self.block_bytes)

    def _attach(self, p: dict[str, Any]) -> RemoteRegion:
        name = p["remote_region"]
        if not isinstance(name, str) or not name.startswith(REGION_PREFIX):
            raise _Failure("bad_params", f"remote_region must name a tokenmill KV region, got {name!r}")
        region = self._attached.get(name)
        if region is None:
            if list(p.get("block_bytes", [])) != self.block_bytes:
                raise _Failure("layout_mismatch", f"block bytes {p.get('block_bytes')} vs ours {self.block_bytes}")
            try:
                region = RemoteRegion(name, int(p["remote_num_blocks"]), self.block_bytes)
            except FileNotFoundError:
                raise _Failure("region_missing", f"no shared-memory region {name!r}") from None
            if len(self._attached) >= MAX_ATTACHED_REGIONS:
                self._attached.pop(next(iter(self._attached)))
            self._attached[name] = region
        return region

    # -- sending --------------------------------------------------------------------------------
    def _save(self, save: SaveSpec) -> dict[str, Any] | None:
        region = self.region
        if region is None:
            logger.warning("request %s asks to send its KV, but this engine's role is %s", save.request_id, self.role)
            return None
        tid = self._next_id
        slot = tid % SLOTS
        if region.lease[slot] != 0:  # SLOTS transfers outstanding: refuse rather than wait
            logger.warning("no free transfer slot for %s: its decode engine will recompute", save.request_id)
            return None
        self._next_id += 1
        crcs = block_checksums(self.rows, save.block_ids)
        region.ack[slot] = 0
        region.lease[slot] = tid
        self._pending[tid] = (save.request_id, self.clock() + save.timeout_s)
        return {"remote_region": region.name, "remote_num_blocks": self.num_blocks,
                "block_bytes": self.block_bytes, "remote_block_ids": list(save.block_ids), "transfer_id": tid,
                "block_checksums": crcs}

    def _poll_sends(self, skip: set[str]) -> None:
        if not self._pending:
            return
        now = self.clock()
        lease, ack = self.region.lease, self.region.ack
        for tid, (rid, deadline) in list(self._pending.items()):
            if rid in skip:
                continue
            slot = tid % SLOTS
            if ack[slot] == tid or now >= deadline:
                lease[slot] = 0  # cleared before the scheduler frees the blocks
                self._out.finished_sending[rid] = "acked" if ack[slot] == tid else "timeout"
                del self._pending[tid]

    def close(self) -> None:
        if self.region is not None:
            self.region.close()


def block_runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) of the runs where both block id lists go up by one."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


class _Failure(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
