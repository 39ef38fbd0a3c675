"""Totals over a period of the cost ledger: per model, pool, tenant and SLO class (any subset),
$ per request and per 1M input / output tokens; per pool, utilization and idle cost.

  $/1M input tokens  = prefill cost / prompt tokens x 1e6   (the device time of prompt tokens)
  $/1M output tokens = decode cost / completion tokens x 1e6
  utilization        = busy seconds / wall seconds of the pool's replicas
  idle cost          = (wall - busy) seconds x $/hour / 3600 (what nobody's requests paid for)
"""
from __future__ import annotations

import math
import re
import sqlite3
import time
from datetime import datetime, timezone

GROUP_KEYS = ("model", "pool", "tenant", "slo_class")


def parse_time(text: str | None, now: float | None = None) -> float | None:
    """'2026-11-30T20:00:00' (UTC unless it says), '90m' / '2h' / '1d' / '30s' ago, or unix seconds."""
    if text is None:
        return None
    now = time.time() if now is None else now
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"time {text!r}: use ISO 8601 (2026-11-30T20:00), a span ago (30s, 90m, 2h, 1d) "
                         "or unix seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _where(since: float | None, until: float | None) -> tuple[str, tuple]:
    clauses, params = [], []
    if since is not None:
        clauses.append("ts >= ?")
        params.append(since)
    if until is not None:
        clauses.append("ts < ?")
        params.append(until)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


def _per(x: float, n: float, scale: float = 1.0) -> float:
    return x / n * scale if n else math.nan


def request_totals(conn: sqlite3.Connection, by: tuple[str, ...] = GROUP_KEYS, since: float | None = None,
                   until: float | None = None) -> list[dict]:
    bad = [k for k in by if k not in GROUP_KEYS]
    if bad:
        raise ValueError(f"--by: {bad} not among {list(GROUP_KEYS)}")
    where, params = _where(since, until)
    keys = ", ".join(by)
    select = (keys + ", " if by else "") + """COUNT(*) AS requests, SUM(prompt_tokens) AS prompt_tokens,
        SUM(completion_tokens) AS completion_tokens, SUM(prefill_device_seconds) AS prefill_device_seconds,
        SUM(decode_device_seconds) AS decode_device_seconds,
        SUM(prefill_device_seconds * price_per_hour / 3600.0) AS prefill_cost_usd,
        SUM(decode_device_seconds * price_per_hour / 3600.0) AS decode_cost_usd, SUM(cost_usd) AS cost_usd"""
    sql = f"SELECT {select} FROM requests{where}" + (f" GROUP BY {keys} ORDER BY cost_usd DESC" if by else "")
    rows = [dict(r) for r in conn.execute(sql, params).fetchall()]
    rows = [r for r in rows if r["requests"]]
    for r in rows:
        r["device_seconds"] = r["prefill_device_seconds"] + r["decode_device_seconds"]
        r["usd_per_request"] = _per(r["cost_usd"], r["requests"])
        r["usd_per_1m_input_tokens"] = _per(r["prefill_cost_usd"], r["prompt_tokens"], 1e6)
        r["usd_per_1m_output_tokens"] = _per(r["decode_cost_usd"], r["completion_tokens"], 1e6)
        r["usd_per_1m_tokens"] = _per(r["cost_usd"], r["prompt_tokens"] + r["completion_tokens"], 1e6)
    return rows


def pool_totals(conn: sqlite3.Connection, since: float | None = None, until: float | None = None) -> list[dict]:
    where, params = _where(since, until)
    sql = f"""SELECT pool, model, hardware, SUM(wall_seconds) AS wall_seconds, SUM(busy_seconds) AS busy_seconds,
              SUM(wall_seconds * price_per_hour / 3600.0) AS wall_cost_usd,
              SUM(MAX(wall_seconds - busy_seconds, 0) * price_per_hour / 3600.0) AS idle_cost_usd
              FROM pool_time{where} GROUP BY pool, model, hardware ORDER BY pool"""
    rows = [dict(r) for r in conn.execute(sql, params).fetchall()]
    for r in rows:
        r["utilization"] = _per(r["busy_seconds"], r["wall_seconds"])
    return rows


def _fmt(v) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def format_table(rows: list[dict], cols: list[str]) -> str:
    if not rows:
        return "(no rows)"
    cells = [[_fmt(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


REQUEST_COLUMNS = ["requests", "prompt_tokens", "completion_tokens", "device_seconds", "cost_usd", "usd_per_request",
                   "usd_per_1m_input_tokens", "usd_per_1m_output_tokens"]
POOL_COLUMNS = ["pool", "model", "hardware", "wall_seconds", "busy_seconds", "utilization", "wall_cost_usd",
                "idle_cost_usd"]
