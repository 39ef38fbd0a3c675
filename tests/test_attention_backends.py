"""Every attention backend against the reference (one sequence at a time, explicit softmax) on the
same mixed batch: decodes and prefill chunks with cached context, random block tables, GQA, plain
and quantized caches. Tolerance: 1e-5 (float32 cache), 1e-4 (int8/fp8: both sides read the same
quantized values, only summation order differs), 2e-2 (bfloat16 activations)."""
import random

import pytest
import torch

from tokenmill.attention import BatchLayout, get_attention_backend
from tokenmill.attention.kv_cache import make_kv_cache_spec
from tokenmill.kernels import cpu_ops

BACKENDS = ["torch"] + (["cpu"] if cpu_ops.load() else [])


def make_batch(rng: random.Random, num_blocks: int, block_size: int, q_lens: list[int], ctx_lens: list[int]):
    """Sequences with `ctx` cached tokens and `q` new ones each, blocks drawn without replacement."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    slots, qsl, seq_lens, tables = [], [0], [], []
    for q, ctx in zip(q_lens, ctx_lens):
        n = ctx + q
        table = [free.pop() for _ in range(-(-n // block_size))]
        pos = torch.arange(ctx, n)
        slots.append(torch.tensor(table)[pos // block_size] * block_size + pos % block_size)
        qsl.append(qsl[-1] + q)
        seq_lens.append(n)
        tables.append(table)
    return BatchLayout(torch.cat(slots), qsl, seq_lens, tables, block_size)


def fill_context(cache, layout: BatchLayout, ctx_lens: list[int], hkv: int, d: int, gen: torch.Generator):
    from tokenmill.attention.kv_cache import write_kv
    for table, ctx in zip(layout.block_tables, ctx_lens):
        if ctx:
            pos = torch.arange(ctx)
            slots = torch.tensor(table)[pos // layout.block_size] * layout.block_size + pos % layout.block_size
            write_kv(cache, torch.randn(ctx, hkv, d, generator=gen), torch.randn(ctx, hkv, d, generator=gen), slots)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_dtype", ["auto", "int8", "fp8"])
@pytest.mark.parametrize("heads,kv_heads,block_size", [(9, 3, 16), (4, 4, 1), (8, 2, 4)])
@pytest.mark.parametrize("mix", ["decode", "mixed", "prefill", "long"])
def test_backend_matches_reference(backend, kv_dtype, heads, kv_heads, block_size, mix):
    rng, gen, d = random.Random(7), torch.Generator().manual_seed(7), 32
    n = 6
    q_lens = {"decode": [1] * n, "mixed": [1, 5, 1, 17, 1, 2], "prefill": [3, 9, 40, 2, 7, 11],
              "long": [300, 1, 270, 1, 2, 257]}[mix]  # long chunks are split into query pieces
    ctx_lens = [rng.choice([0, 1, 15, 16, 33, 70]) for _ in range(n)]
    if mix == "decode":
        ctx_lens = [max(c, 1) for c in ctx_lens]  # a decode always has context
    layout = make_batch(rng, 1024, block_size, q_lens, ctx_lens)
    t = sum(q_lens)
    q = torch.randn(t, heads, d, generator=gen)
    k, v = torch.randn(t, kv_heads, d, generator=gen), torch.randn(t, kv_heads, d, generator=gen)
    spec = make_kv_cache_spec(kv_dtype, torch.float32, block_size, kv_heads, d, 1024)
    outs = {}
    for name in ("reference", backend):
        gen_ctx = torch.Generator().manual_seed(11)
        cache = spec.allocate()
        fill_context(cache, layout, ctx_lens, kv_heads, d, gen_ctx)
        impl = get_attention_backend(name)
        outs[name] = impl.forward(q, k, v, cache, impl.build_metadata(layout), d ** -0.5)
    tol = 1e-5 if kv_dtype == "auto" else 1e-4
    torch.testing.assert_close(outs[backend], outs["reference"], atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_activations(backend):
    rng, gen, d = random.Random(3), torch.Generator().manual_seed(3), 64
    q_lens, ctx_lens = [1, 1, 6, 1], [20, 47, 16, 1]
    layout = make_batch(rng, 64, 16, q_lens, ctx_lens)
    t = sum(q_lens)
    q = torch.randn(t, 6, d, generator=gen).bfloat16()
    k, v = (torch.randn(t, 2, d, generator=gen).bfloat16() for _ in range(2))
    spec = make_kv_cache_spec("auto", torch.bfloat16, 16, 2, d, 64)
    outs = {}
    for name in ("reference", backend):
        cache = spec.allocate()
        fill_context(cache, layout, ctx_lens, 2, d, torch.Generator().manual_seed(5))
        impl = get_attention_backend(name)
        outs[name] = impl.forward(q, k, v, cache, impl.build_metadata(layout), d ** -0.5)
    assert outs[backend].dtype == torch.bfloat16
    torch.testing.assert_close(outs[backend].float(), outs["reference"].float(), atol=2e-2, rtol=2e-2)


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="auto, cpu, torch, reference"):
        get_attention_backend("flash")


def test_kernel_switch_off_falls_back(monkeypatch):
    from tokenmill.attention.torch_paged import TorchPagedBackend
    monkeypatch.setattr(cpu_ops, "_state", {})
    monkeypatch.setenv("TOKENMILL_CPU_KERNELS", "0")
    assert type(get_attention_backend("auto")) is TorchPagedBackend
    with pytest.raises(RuntimeError, match="attention_backend='torch'"):
        get_attention_backend("cpu")


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the C++ kernels did not build here")
def test_cpu_backend_sends_every_prompt_row_to_the_prefill_kernel():
    """A prompt's lone row (its last token after a prefix hit, or a one-token chunk) takes the
    prefill kernel like the prompt's other rows, so prompt rows get the same math however the prompt
    is cached or chunked; a generated token's row stays a decode, and a chunk running past its prompt
    (a preempted request's recompute) is split where the prompt ends. Without prompt lengths every lone
    row is a decode; in batch-invariant mode rows up to DECODE_ROWS_MAX are decodes as before."""
    from tokenmill.attention.cpu_paged import DECODE_ROWS_MAX
    layout = make_batch(random.Random(0), 64, 4, [1, 1, 5], [12, 20, 3])
    backend = get_attention_backend("cpu")
    layout.prompt_lens = [13, 15, 8]  # seq 0: its last prompt token; seq 1: decoding; seq 2: a chunk
    meta = backend.build_metadata(layout)
    assert [(p.start, p.end, p.context, p.prompt) for p in meta.prefills] == [(0, 1, 12, True), (2, 7, 3, True)]
    assert meta.decodes.seq_lens.tolist() == [21]
    layout.prompt_lens = [13, 15, 6]  # seq 2 recomputes 3 prompt tokens and 2 generated ones (preempted)
    meta = backend.build_metadata(layout)
    assert [(p.start, p.end, p.context, p.prompt) for p in meta.prefills][1:] == [(2, 5, 3, True), (5, 7, 6, False)]
    layout.prompt_lens = None
    meta = backend.build_metadata(layout)
    assert meta.decodes.seq_lens.tolist() == [13, 21] and [p.prompt for p in meta.prefills] == [False]
    layout.prompt_lens = [13, 15, 8]
    cpu_ops.set_batch_invariant(True)
    try:
        meta = backend.build_metadata(layout)
    finally:
        cpu_ops.set_batch_invariant(False)
    assert 5 <= DECODE_ROWS_MAX and not meta.prefills and len(meta.decodes.seq_lens) == 2 + 5


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the C++ kernels did not build here")
@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_backend_runs_draft_chunks_as_decode_rows(kv_dtype, threads):
    """Speculative verification's rows (a chunk of at most DECODE_ROWS_MAX generated tokens) run as
    decode rows reading the cache in place, each seeing the keys up to its own position, outside
    batch-invariant mode too; a longer chunk of generated tokens and a short prompt chunk stay chunks.
    Against the reference at 1e-5 (float32 cache) / 1e-4 (int8), long contexts included (split-K)."""
    from tokenmill.attention.cpu_paged import DECODE_ROWS_MAX
    rng, gen, d, heads, kv_heads = random.Random(5), torch.Generator().manual_seed(5), 32, 6, 2
    q_lens, ctx_lens = [1, 5, DECODE_ROWS_MAX + 1, 5, DECODE_ROWS_MAX], [12, 700, 20, 40, 1500]
    layout = make_batch(rng, 512, 16, q_lens, ctx_lens)
    layout.prompt_lens = [6, 300, 10, 43, 1]  # seq 3's chunk is prompt (40..44 < 43 partly): a chunk
    backend = get_attention_backend("cpu")
    meta = backend.build_metadata(layout)
    assert [(p.start, p.end) for p in meta.prefills] == [(6, 23), (23, 26), (26, 28)]  # 17 drafts; seq 3 split
    assert meta.decodes.seq_lens.tolist() == [13] + list(range(701, 706)) + list(range(1501, 1501 + DECODE_ROWS_MAX))
    t = sum(q_lens)
    q = torch.randn(t, heads, d, generator=gen)
    k, v = torch.randn(t, kv_heads, d, generator=gen), torch.randn(t, kv_heads, d, generator=gen)
    spec = make_kv_cache_spec(kv_dtype, torch.float32, 16, kv_heads, d, 512)
    outs = {}
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name in ("reference", "cpu"):
            cache = spec.allocate()
            fill_context(cache, layout, ctx_lens, kv_heads, d, torch.Generator().manual_seed(9))
            impl = get_attention_backend(name)
            outs[name] = impl.forward(q, k, v, cache, impl.build_metadata(layout), d ** -0.5)
    finally:
        torch.set_num_threads(old)
    tol = 1e-5 if kv_dtype == "auto" else 1e-4
    torch.testing.assert_close(outs["cpu"], outs["reference"], atol=tol, rtol=tol)
