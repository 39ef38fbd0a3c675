"""KV block events: what a router reads to know an engine's prefix cache."""
from __future__ import annotations

from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.kv_events import KVEventLog
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams


def test_events_follow_the_pool_and_a_late_reader_gets_a_snapshot():
    kv = KVCacheManager(8, 4, extra_key="m")
    kv.pool.events = log = KVEventLog(max_events=6)
    req = Request("a", list(range(12)), SamplingParams())
    assert kv.allocate_slots(req, 12)
    kv.cache_blocks(req, 12)
    hashes = kv.block_hashes(req, 12)
    first = log.since(0)
    assert first.reset and set(first.stored) == set(hashes)
    kv.free(req)
    other = Request("b", [99] * 32, SamplingParams())
    assert kv.allocate_slots(other, 32)  # takes every block: the three cached ones are evicted
    batch = log.since(first.seq)
    assert not batch.reset and set(batch.removed) == set(hashes) and not batch.stored
    assert log.since(batch.seq).stored == [] and log.since(batch.seq).seq == batch.seq
    kv.cache_blocks(other, 32)  # 8 more events: the log (6) no longer reaches back to first.seq
    late = log.since(first.seq)
    assert late.reset and set(late.stored) == set(kv.block_hashes(other, 32))  # the cache as it is now
