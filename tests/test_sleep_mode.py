"""Sleep mode (vLLM's level 1): the KV cache is released and the weights stay; after wake_up the
engine gives the same greedy tokens as before; it refuses requests while asleep and will not
sleep with requests unfinished."""
import pytest

from tokenmill import LLM, SamplingParams


def test_sleep_releases_the_kv_cache_and_wake_up_restores_the_engine(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.02)
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=12, temperature=0)
    before = [o.outputs[0].token_ids for o in llm.generate(["hello world", "the cat"], params, use_tqdm=False)]
    kv_bytes = sum(t.numel() * t.element_size() for layer in engine.runner.kv_caches for t in layer)
    assert kv_bytes > 0
    weights = [p.data_ptr() for p in engine.runner.model.parameters()]

    engine.sleep()
    assert engine.is_sleeping and engine.runner.kv_caches == []
    with pytest.raises(RuntimeError, match="sleeping"):
        engine.add_request(None, "hello", params)

    engine.wake_up()
    assert not engine.is_sleeping
    assert sum(t.numel() * t.element_size() for layer in engine.runner.kv_caches for t in layer) == kv_bytes
    assert [p.data_ptr() for p in engine.runner.model.parameters()] == weights  # never moved
    after = [o.outputs[0].token_ids for o in llm.generate(["hello world", "the cat"], params, use_tqdm=False)]
    assert after == before

    engine.add_request("busy", "hello", params)
    with pytest.raises(RuntimeError, match="1 requests are unfinished"):
        engine.sleep()
