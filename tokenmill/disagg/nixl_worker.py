"""The worker half of the NIXL connector (`--kv-connector nixl`, extra `tokenmill[nixl]`): the pull
model of NVIDIA's NIXL, on CPU memory over UCX (loopback in tests; any network UCX reaches).

Each engine registers its KV tensors (as they are: no shared memory) with a NIXL agent. The
prefill side, after the forward that completed a prompt, checksums the request's blocks and
returns transfer parameters: its agent's name and metadata, the base address and bytes per block
of each KV tensor, the block ids, a transfer id and the per-block crc32. It keeps the blocks held
(the scheduler half delays their freeing) until a notification "tokenmill-ack:<id>" arrives from
the decode side, or the timeout. The decode side adds the remote agent, READs each run of
consecutive blocks of each tensor straight into its own blocks, notifies the sender with the same
READ, and checks every block's crc32; a failure (a NIXL error, a transfer that does not finish in
`LOAD_TIMEOUT_S`, a checksum) makes it compute the prompt locally.
"""
from __future__ import annotations

import base64
import logging
import os
import time
import uuid
from typing import Any

from tokenmill.disagg.connector import LoadSpec, SaveSpec
from tokenmill.disagg.worker_base import ConnectorWorkerBase
from tokenmill.disagg.shm_region import block_bytes_of, block_checksums, byte_rows, flat_tensors
from tokenmill.disagg.shm_worker import _Failure, block_runs

logger = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 30.0
ACK_PREFIX = b"tokenmill-ack:"


def import_nixl():
    try:
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    except ImportError:
        try:
            from nixl._api import nixl_agent, nixl_agent_config
        except ImportError:
            raise ValueError("kv_connector nixl needs the NIXL package: pip install 'tokenmill[nixl]' "
                             "(nixl-cu12; it runs on CPU memory over UCX)") from None
    return nixl_agent, nixl_agent_config


class NixlConnectorWorker(ConnectorWorkerBase):
    def __init__(self, role: str, kv_caches: list, num_blocks: int, clock=time.monotonic) -> None:
        super().__init__()
        nixl_agent, nixl_agent_config = import_nixl()
        self.role = role
        self.num_blocks = num_blocks
        self.clock = clock
        self.kv_caches = kv_caches
        tensors = flat_tensors(kv_caches)
        self.block_bytes = block_bytes_of(tensors, num_blocks)
        self.rows = [byte_rows(t, num_blocks) for t in tensors]
        self.base_addrs = [r.data_ptr() for r in self.rows]
        self.name = f"tokenmill-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.agent = nixl_agent(self.name, nixl_agent_config(backends=["UCX"]))
        self.agent.register_memory(self.rows)
        self._metadata = base64.b64encode(self.agent.get_agent_metadata()).decode()
        self._remotes: dict[str, str] = {}  # their agent name -> the name NIXL knows it by
        self._pending: dict[int, tuple[str, float]] = {}
        self._acked: set[int] = set()  # transfer ids the receiver notified
        self._next_id = 1
        logger.info("NIXL agent %s (UCX) registered %d KV tensors, %.1f MiB", self.name, len(self.rows),
                    sum(b * num_blocks for b in self.block_bytes) / (1 << 20))

    # -- receiving ------------------------------------------------------------------------------
    def _remote(self, p: dict[str, Any]) -> str:
        name = p.get("remote_agent")
        if not isinstance(name, str) or "agent_metadata" not in p:
            raise _Failure("bad_params", "no remote_agent / agent_metadata: not a NIXL hand-over")
        known = self._remotes.get(name)
        if known is None:
            if list(p.get("block_bytes", [])) != self.block_bytes:
                raise _Failure("layout_mismatch", f"block bytes {p.get('block_bytes')} vs ours {self.block_bytes}")
            added = self.agent.add_remote_agent(base64.b64decode(p["agent_metadata"]))
            known = added.decode() if isinstance(added, bytes) else added
            self._remotes[name] = known
        return known

    def _load(self, load: LoadSpec) -> tuple[int, int] | None:
        p = load.params
        remote = self._remote(p)
        tid = int(p["transfer_id"])
        ack = ACK_PREFIX + str(tid).encode()
        if load.ack_only:
            self.agent.send_notif(remote, ack)
            return None
        remote_ids = list(p["remote_block_ids"])[load.first_block:load.first_block + len(load.local_block_ids)]
        if len(remote_ids) != len(load.local_block_ids):
            raise _Failure("bad_params", f"{len(remote_ids)} remote blocks for {len(load.local_block_ids)} local")
        runs = block_runs(remote_ids, load.local_block_ids)
        theirs, mine = [], []
        for base_r, base_l, bb in zip(p["remote_base_addrs"], self.base_addrs, self.block_bytes):
            for s, d, n in runs:
                theirs.append((base_r + s * bb, n * bb, 0))
                mine.append((base_l + d * bb, n * bb, 0))
        handle = self.agent.initialize_xfer("READ", self.agent.get_xfer_descs(mine, "DRAM"),
                                            self.agent.get_xfer_descs(theirs, "DRAM"), remote, ack)
        try:
            state = self.agent.transfer(handle)
            deadline = time.monotonic() + LOAD_TIMEOUT_S
            while state != "DONE":
                if state == "ERR":
                    raise _Failure("transfer_error", "NIXL reported an error")
                if time.monotonic() > deadline:
                    raise _Failure("timeout", f"the READ did not finish in {LOAD_TIMEOUT_S:.0f} s")
                state = self.agent.check_xfer_state(handle)
        except _Failure:
            self.agent.send_notif(remote, ack)  # the sender may free: we will not read them
            raise
        finally:
            self.agent.release_xfer_handle(handle)
        want = list(p["block_checksums"])[load.first_block:load.first_block + len(remote_ids)]
        if block_checksums(self.rows, load.local_block_ids) != want:
            raise _Failure("checksum_mismatch", "the copied blocks' crc32 differ from the sender's")
        return int(p["num_tokens"]), len(remote_ids) * sum(self.block_bytes)

    # -- sending --------------------------------------------------------------------------------
    def _save(self, save: SaveSpec) -> dict[str, Any]:
        tid = self._next_id
        self._next_id += 1
        crcs = block_checksums(self.rows, save.block_ids)
        self._pending[tid] = (save.request_id, self.clock() + save.timeout_s)
        return {"remote_agent": self.name, "agent_metadata": self._metadata, "remote_base_addrs": self.base_addrs,
                "block_bytes": self.block_bytes, "remote_num_blocks": self.num_blocks,
                "remote_block_ids": list(save.block_ids), "transfer_id": tid, "block_checksums": crcs}

    def _poll_sends(self, skip: set[str]) -> None:
        if not self._pending:
            return
        for msgs in self.agent.get_new_notifs().values():
            for m in msgs:
                if m.startswith(ACK_PREFIX):
                    self._acked.add(int(m[len(ACK_PREFIX):]))
        now = self.clock()
        for tid, (rid, deadline) in list(self._pending.items()):
            if rid in skip:
                continue
            if tid in self._acked or now >= deadline:
                self._out.finished_sending[rid] = "acked" if tid in self._acked else "timeout"
                self._acked.discard(tid)
                del self._pending[tid]

    def close(self) -> None:
        pass
