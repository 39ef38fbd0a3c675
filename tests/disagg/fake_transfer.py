"""A model-free executor whose "KV" is the token id written at each slot, and a worker half that
moves those slots between two engines through a dict (leases, acks, checksums and timeouts as the
shared-memory worker has them): the scheduler half and the core's transfer lifecycle, tested
without torch."""
from __future__ import annotations

from tokenmill.core.outputs import ModelRunnerOutput
from tokenmill.core.scheduler_output import SchedulerOutput
from tokenmill.disagg.connector import KVConnectorMetadata, KVConnectorOutput, TransferRecord


class FakeRegion:
    def __init__(self) -> None:
        self.transfers: dict[int, dict] = {}  # transfer id -> {"blocks": [[token ids]], "lease": bool, "ack": bool}
        self.next_id = 1


class FakeWorker:
    def __init__(self, region: FakeRegion, executor: SlotExecutor, clock, corrupt: bool = False) -> None:
        self.region, self.executor, self.clock, self.corrupt = region, executor, clock, corrupt
        self.pending: dict[int, tuple[str, float]] = {}
        self.out = KVConnectorOutput()

    def start_load_kv(self, meta: KVConnectorMetadata | None) -> None:
        for load in meta.loads if meta else []:
            try:  # as the real workers: any failure means the prompt is computed locally
                self._load(load)
            except Exception:  # noqa: BLE001
                if not load.ack_only:
                    self.out.failed_recving[load.request_id] = "error"

    def _load(self, load) -> None:
        p = load.params
        t = self.region.transfers.get(p["transfer_id"])
        if load.ack_only:
            if t is not None:
                t["ack"] = True
            return
        if t is None or not t["lease"]:
            self.out.failed_recving[load.request_id] = "lease_expired"
            return
        blocks = t["blocks"][load.first_block:load.first_block + len(load.local_block_ids)]
        for local, content in zip(load.local_block_ids, blocks):
            self.executor.write_block(local, [(x or 0) + 1000 for x in content] if self.corrupt else content)
        t["ack"] = True
        got = [hash(tuple(self.executor.read_block(b))) for b in load.local_block_ids]
        if got != p["block_checksums"][load.first_block:load.first_block + len(got)]:
            self.out.failed_recving[load.request_id] = "checksum_mismatch"
            return
        self.out.finished_recving[load.request_id] = TransferRecord(load.request_id, p["num_tokens"],
                                                                    len(got) * 8, 0.0)

    def save_kv(self, meta: KVConnectorMetadata | None) -> None:
        for save in meta.saves if meta else []:
            tid = self.region.next_id
            self.region.next_id += 1
            blocks = [self.executor.read_block(b) for b in save.block_ids]
            self.region.transfers[tid] = {"blocks": blocks, "lease": True, "ack": False}
            self.pending[tid] = (save.request_id, self.clock() + save.timeout_s)
            self.out.saved[save.request_id] = {"remote_region": "fake", "remote_block_ids": list(save.block_ids),
                                               "transfer_id": tid,
                                               "block_checksums": [hash(tuple(b)) for b in blocks]}

    def get_finished(self) -> KVConnectorOutput | None:
        for tid, (rid, deadline) in list(self.pending.items()):
            if rid in self.out.saved:
                continue
            t = self.region.transfers[tid]
            if t["ack"] or self.clock() >= deadline:
                t["lease"] = False
                self.out.finished_sending[rid] = "acked" if t["ack"] else "timeout"
                del self.pending[tid]
        out, self.out = self.out, KVConnectorOutput()
        return None if out.is_empty else out


class SlotExecutor:
    """Writes each computed token's id into its KV slot; samples `token_id` (or prompt-derived
    tokens: sum of the KV it "attends" to, so wrong KV gives a different token)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.bs = block_size
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        self.reqs: dict[str, dict] = {}
        self.num_computed_tokens = 0  # tokens whose KV this executor computed
        self.worker: FakeWorker | None = None
        self.steps: list[SchedulerOutput] = []

    def read_block(self, b: int) -> list:
        return self.slots[b * self.bs:(b + 1) * self.bs]

    def write_block(self, b: int, content: list) -> None:
        self.slots[b * self.bs:(b + 1) * self.bs] = content

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        meta = out.kv_connector_metadata
        self.steps.append(out)
        if self.worker is not None:
            self.worker.start_load_kv(meta)
        for rid in list(out.finished_request_ids) + list(out.preempted_request_ids):
            self.reqs.pop(rid, None)
        for new in out.new_requests:
            self.reqs[new.request_id] = {"tokens": list(new.prompt_token_ids) + list(new.output_token_ids),
                                         "blocks": list(new.block_ids), "computed": new.num_computed_tokens}
        for c in out.cached_requests:
            r = self.reqs[c.request_id]
            r["blocks"] += c.new_block_ids
            r["computed"] = c.num_computed_tokens
        ids, sampled = [], []
        for rid, n in out.num_scheduled_tokens.items():
            r = self.reqs[rid]
            for pos in range(r["computed"], r["computed"] + n):
                self.slots[r["blocks"][pos // self.bs] * self.bs + pos % self.bs] = r["tokens"][pos]
                self.num_computed_tokens += 1
            r["computed"] += n
            if r["computed"] == len(r["tokens"]):
                seen = [self.slots[r["blocks"][p // self.bs] * self.bs + p % self.bs] for p in range(r["computed"])]
                token = sum(seen) % 997  # depends on every KV slot the request attends to
                r["tokens"].append(token)
                ids.append(rid)
                sampled.append([token])
        result = ModelRunnerOutput(ids, sampled)
        if self.worker is not None:
            self.worker.save_kv(meta)
            result.kv_connector_output = self.worker.get_finished()
        return result
