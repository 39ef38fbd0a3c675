"""`tokenmill:kv_cache_resident_bytes` (attention/kv_cache.py: resident_bytes): the KV cache is mapped
lazily, so the bytes the OS holds for it start near 0, grow as blocks are first written, stay
within the allocation, and never count a page twice."""
from __future__ import annotations

from tokenmill import LLM, SamplingParams
from tokenmill.attention.kv_cache import resident_bytes


def test_resident_kv_bytes_grow_as_blocks_are_first_written(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.05)
    caches = list(llm.llm_engine.runner.kv_caches)
    allocated = sum(t.numel() * t.element_size() for layer in caches for t in layer)
    before = resident_bytes(caches)
    llm.generate([[5] * 200] * 4, SamplingParams(max_tokens=40, ignore_eos=True), use_tqdm=False)
    after = resident_bytes(caches)
    tensors = sum(len(layer) for layer in caches)
    assert 0 <= before < after <= allocated + 2 * 4096 * tensors  # a partial page at each tensor's two ends
    assert before < 0.05 * allocated  # lazily mapped: nothing written yet
    assert resident_bytes(caches) == after  # idle: no growth
