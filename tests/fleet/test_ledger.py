"""The cost ledger: entries survive a restart, nothing is changed or deleted, and the summary's
arithmetic ($/request, $/1M input and output tokens, utilization, idle cost) from the rows."""
import sqlite3
import subprocess
import sys

import pytest

from tokenmill.fleet.ledger import Ledger, PoolTimeEntry, RequestEntry, connect
from tokenmill.fleet.ledger_summary import parse_time, pool_totals, request_totals


def _req(ts, tenant="acme", pool="premium", price=3.6, prefill=1.0, decode=2.0, prompt=100, out=50):
    return RequestEntry(ts, f"r{ts}", "default", pool, f"{pool}-0", "hw", tenant, "interactive", "ok", prompt, out, 0,
                        prefill, decode, price, 0.1, 0.01, 1.0)


def test_a_restart_keeps_the_ledger_and_appends(tmp_path):
    path = tmp_path / "ledger.sqlite"
    first = Ledger(path)
    first.record_request(_req(1000.0))
    first.close()
    second = Ledger(path)  # the fleet started again on the same file
    second.record_request(_req(2000.0, tenant="globex"))
    rows = second.run(lambda c: request_totals(c, ("tenant",)))
    second.close()
    assert {r["tenant"]: r["requests"] for r in rows} == {"acme": 1, "globex": 1}


def test_rows_cannot_be_changed_or_deleted(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    ledger.record_request(_req(1.0))
    ledger.record_pool_time(PoolTimeEntry(1.0, "premium", "premium-0", "default", "hw", 3.6, 10.0, 4.0))
    ledger.close()
    conn = connect(path)
    for sql in ("UPDATE requests SET cost_usd = 0", "DELETE FROM requests", "DELETE FROM pool_time"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute(sql)


def test_summary_arithmetic(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    # $3.6/hour = $0.001 per device-second
    ledger.record_request(_req(10.0, prefill=1.0, decode=2.0, prompt=100, out=50))
    ledger.record_request(_req(20.0, prefill=3.0, decode=2.0, prompt=300, out=150))
    ledger.record_request(_req(30.0, pool="economy", price=0.36, prefill=10, decode=10))
    ledger.record_pool_time(PoolTimeEntry(15.0, "premium", "premium-0", "default", "hw", 3.6, 100.0, 8.0))
    ledger.record_pool_time(PoolTimeEntry(25.0, "premium", "premium-0", "default", "hw", 3.6, 100.0, 0.0))
    rows = ledger.run(lambda c: request_totals(c, ("pool",)))
    pools = ledger.run(lambda c: pool_totals(c))
    early = ledger.run(lambda c: request_totals(c, ("pool",), since=5.0, until=15.0))
    ledger.close()
    premium = next(r for r in rows if r["pool"] == "premium")
    assert premium["requests"] == 2 and premium["cost_usd"] == pytest.approx(0.008)
    assert premium["usd_per_request"] == pytest.approx(0.004)
    assert premium["usd_per_1m_input_tokens"] == pytest.approx(0.004 / 400 * 1e6)
    assert premium["usd_per_1m_output_tokens"] == pytest.approx(0.004 / 200 * 1e6)
    assert next(r for r in rows if r["pool"] == "economy")["cost_usd"] == pytest.approx(20 * 0.0001)
    (p,) = pools
    assert p["utilization"] == pytest.approx(8 / 200) and p["idle_cost_usd"] == pytest.approx(192 * 0.001)
    assert [r["requests"] for r in early] == [1]


def test_parse_time():
    assert parse_time("90m", now=10_000.0) == 10_000.0 - 5400
    assert parse_time("1970-01-01T00:01:00") == 60.0
    assert parse_time("123.5") == 123.5 and parse_time(None) is None
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time("yesterday")


def test_ledger_command(tmp_path):
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    ledger.record_request(_req(10.0))
    ledger.close()
    r = subprocess.run([sys.executable, "-m", "tokenmill", "ledger", "--ledger", str(path), "--by", "tenant"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "acme" in r.stdout and "0.003" in r.stdout  # 3 device-seconds at $0.001
    r = subprocess.run([sys.executable, "-m", "tokenmill", "ledger", "--ledger", str(tmp_path / "none.sqlite")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no such file" in r.stderr
