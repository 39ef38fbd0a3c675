"""The cost ledger: an append-only SQLite file of what every finished request cost, and of how long
each replica was up and busy (so idle time is billed too). It survives restarts: a fleet started
again on the same file appends to it.

    requests   one row per finished request: who (tenant, SLO class), where (model, pool, replica,
               hardware, $/hour), tokens, the device-seconds its engine charged it (its share, by
               tokens, of each engine step it was in; prefill and decode apart) and cost_usd =
               device_seconds x price_per_hour / 3600, latencies
    pool_time  one row per replica per interval: wall seconds up and busy seconds (the engine's
               tokenmill:engine_busy_seconds_total increase); idle cost = (wall - busy) x $/hour

Rows are never changed or deleted (triggers refuse it). Writes go through one thread, so the
server's event loop never waits on the disk.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
  ts REAL NOT NULL, request_id TEXT NOT NULL, model TEXT NOT NULL, pool TEXT NOT NULL, replica TEXT NOT NULL,
  hardware TEXT NOT NULL, tenant TEXT NOT NULL, slo_class TEXT NOT NULL, status TEXT NOT NULL,
  prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
  prefill_device_seconds REAL NOT NULL, decode_device_seconds REAL NOT NULL, price_per_hour REAL NOT NULL,
  cost_usd REAL NOT NULL, ttft_s REAL, tpot_s REAL, e2e_s REAL);
CREATE TABLE IF NOT EXISTS pool_time (
  ts REAL NOT NULL, pool TEXT NOT NULL, replica TEXT NOT NULL, model TEXT NOT NULL, hardware TEXT NOT NULL,
  price_per_hour REAL NOT NULL, wall_seconds REAL NOT NULL, busy_seconds REAL NOT NULL);
CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts);
CREATE INDEX IF NOT EXISTS pool_time_ts ON pool_time (ts);
CREATE TRIGGER IF NOT EXISTS requests_append_only_u BEFORE UPDATE ON requests
  BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS requests_append_only_d BEFORE DELETE ON requests
  BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS pool_time_append_only_u BEFORE UPDATE ON pool_time
  BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS pool_time_append_only_d BEFORE DELETE ON pool_time
  BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
"""


def cost_usd(device_seconds: float, price_per_hour: float) -> float:
    return device_seconds * price_per_hour / 3600.0


@dataclass(frozen=True)
class RequestEntry:
    ts: float  # unix time the request finished
    request_id: str
    model: str
    pool: str
    replica: str
    hardware: str
    tenant: str
    slo_class: str
    status: str  # "ok"; "error" (it failed after reaching an engine); "abandoned" (its client left mid-stream:
    # aborted, billed what the engine charged it until then)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    prefill_device_seconds: float
    decode_device_seconds: float
    price_per_hour: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @property
    def device_seconds(self) -> float:
        return self.prefill_device_seconds + self.decode_device_seconds

    @property
    def cost_usd(self) -> float:
        return cost_usd(self.device_seconds, self.price_per_hour)


@dataclass(frozen=True)
class PoolTimeEntry:
    ts: float  # unix time at the end of the interval
    pool: str
    replica: str
    model: str
    hardware: str
    price_per_hour: float
    wall_seconds: float
    busy_seconds: float


_REQ_COLS = [f.name for f in fields(RequestEntry)]
_REQ_COLS.insert(_REQ_COLS.index("ttft_s"), "cost_usd")
_POOL_COLS = [f.name for f in fields(PoolTimeEntry)]


def connect(path: str | Path, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        if not Path(path).exists():
            raise ValueError(f"ledger {path}: no such file")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(SCHEMA)
    conn.row_factory = sqlite3.Row
    return conn


class Ledger:
    """Appends entries from any thread or coroutine; `flush()` waits until they are on disk."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger")
        self._conn = self._writer.submit(connect, self.path).result()
        self._last: Future | None = None
        self._lock = threading.Lock()

    def record_request(self, entry: RequestEntry) -> None:
        row = {**asdict(entry), "cost_usd": entry.cost_usd}
        self._submit("requests", _REQ_COLS, [row[c] for c in _REQ_COLS])

    def record_pool_time(self, entry: PoolTimeEntry) -> None:
        self._submit("pool_time", _POOL_COLS, [getattr(entry, c) for c in _POOL_COLS])

    def _submit(self, table: str, cols: list[str], values: list) -> None:
        sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        with self._lock:
            self._last = self._writer.submit(self._insert, sql, values)

    def _insert(self, sql: str, values: list) -> None:
        with self._conn:
            self._conn.execute(sql, values)

    def flush(self) -> None:
        with self._lock:
            last = self._last
        if last is not None:
            last.result()

    def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """fn(connection) on the writer thread: it sees every entry recorded before it."""
        return self._writer.submit(fn, self._conn).result()

    def close(self) -> None:
        self.flush()
        self._writer.submit(self._conn.close).result()
        self._writer.shutdown(wait=True)


def now() -> float:
    return time.time()
