"""The default model's 8-bit block LM head: q8_linear + argmax over the logits against q_argmax_linear
(the same indices, asserted), best of 4 alternated rounds, at 1, 8 and 64 rows.
    python docs/benchmarks/isa/session34/argmax_head_ab.py"""
import time

import torch

from tokenmill import LLM

llm = LLM(kv_cache_memory_gb=0.1)
h = llm.llm_engine.runner.model.lm_head
V = h.out_features
for M in (1, 8, 64):
    x = torch.randn(M, h.in_features)
    a = lambda: torch.ops.tokenmill.q8_linear(x, h.records, h.out_features, None)[:, :V].argmax(-1)  # noqa: E731
    b = lambda: torch.ops.tokenmill.q_argmax_linear(x, h.records, 8, h.out_features, V)  # noqa: E731
    assert torch.equal(a(), b())
    res = {"a": [], "b": []}
    for r in range(4):
        for k, f in (("a", a), ("b", b)):
            n = 20 if M < 64 else 5
            t = time.perf_counter()
            for _ in range(n):
                f()
            res[k].append((time.perf_counter() - t) / n * 1e3)
    print(M, "logits+argmax %.2f ms" % min(res["a"]), "fused %.2f ms" % min(res["b"]))
