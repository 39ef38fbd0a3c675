"""`tokenmill:kv_cache_resident_bytes` (attention/kv_cache.py: resident_bytes): the bytes the OS holds
for the KV tensors stay within their allocation and cover every slot written. (Whether the cache
starts unmapped depends on the allocator: in a process that freed memory before, calloc may hand
back pages that are already resident, so the test does not assume it.)"""
from __future__ import annotations

from tokenmill import LLM, SamplingParams
from tokenmill.attention.kv_cache import resident_bytes


def test_resident_kv_bytes_cover_written_slots_within_the_allocation(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.05, enable_prefix_caching=False)
    caches = list(llm.llm_engine.runner.kv_caches)
    tensors = [t for layer in caches for t in layer]
    allocated = sum(t.numel() * t.element_size() for t in tensors)
    per_slot = sum(t.numel() * t.element_size() // t.shape[0] for t in tensors)
    prompts = [{"prompt_token_ids": [5 + i] * 200} for i in range(4)]  # each writes 200 + 39 slots
    llm.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True), use_tqdm=False)
    resident = resident_bytes(caches)
    assert 4 * 239 * per_slot <= resident <= allocated + 2 * 4096 * len(tensors)  # partial pages at the ends
    assert resident_bytes(caches) == resident  # idle: nothing new mapped
