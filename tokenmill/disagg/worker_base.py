"""What every KV connector worker does the same way around its own transport: per step, run the
loads and saves the scheduler half asked for (a failed load means: compute the prompt here), then
report what finished. Subclasses move the bytes: `_load`, `_save`, `_poll_sends`."""
from __future__ import annotations

import logging
import time
from typing import Any

from tokenmill.disagg.connector import KVConnectorMetadata, KVConnectorOutput, LoadSpec, SaveSpec, TransferRecord

logger = logging.getLogger(__name__)


class ConnectorWorkerBase:
    def __init__(self) -> None:
        self._out = KVConnectorOutput()

    def start_load_kv(self, metadata: KVConnectorMetadata | None) -> None:
        if metadata is None:
            return
        for load in metadata.loads:
            t0 = time.perf_counter()
            try:
                record = self._load(load)
            except Exception as e:  # noqa: BLE001 - any failure means: compute the prompt here
                if not load.ack_only:
                    self._out.failed_recving[load.request_id] = getattr(e, "reason", "error")
                logger.warning("KV load for %s failed (%s): computing its prompt locally", load.request_id, e)
                continue
            if record is not None:
                self._out.finished_recving[load.request_id] = TransferRecord(
                    load.request_id, record[0], record[1], time.perf_counter() - t0)

    def save_kv(self, metadata: KVConnectorMetadata | None) -> None:
        if metadata is None or not metadata.saves:
            return
        for save in metadata.saves:
            self._out.saved[save.request_id] = self._save(save)

    def get_finished(self) -> KVConnectorOutput | None:
        self._poll_sends(skip=set(self._out.saved))  # a request saved this step finishes in it: poll it next step
        out, self._out = self._out, KVConnectorOutput()
        return None if out.is_empty else out

    def _load(self, load: LoadSpec) -> tuple[int, int] | None:
        """(bytes, blocks) once the KV landed; None for an ack-only load."""
        raise NotImplementedError

    def _save(self, save: SaveSpec) -> dict[str, Any] | None:
        """The transfer parameters the receiver needs."""
        raise NotImplementedError

    def _poll_sends(self, skip: set[str]) -> None:
        raise NotImplementedError
