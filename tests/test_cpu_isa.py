"""Run-time ISA dispatch of our C++ kernels: every level this CPU can run gives the reference result
(bf16 GEMM against a float64 product of the same bf16 weights: 1e-5 relative to the largest output
for the float32-activation paths, 1e-5 too for the AVX512_BF16 path against bf16-rounded x, since
both sum exact products in float32), levels are capped as asked, and the built library keeps
AVX-512 instructions inside the functions that are only called on AVX-512 CPUs."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tokenmill.kernels import cpu_ops

pytestmark = pytest.mark.skipif(not cpu_ops.load(), reason="C++ kernels unavailable here")


@pytest.fixture
def restore_isa():
    yield
    cpu_ops.set_isa("auto")


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("level", cpu_ops.LEVELS)
@pytest.mark.parametrize("m,n,k", [(1, 37, 19), (5, 64, 576), (13, 100, 33), (30, 70, 128)])
def test_bf16_panel_linear_every_level(level, m, n, k, restore_isa):
    if level not in cpu_ops.runnable_levels():
        pytest.skip(f"this CPU cannot run {level} ({cpu_ops.isa()})")
    assert cpu_ops.set_isa(level) == level
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    w, x, bias = torch.randn(n, k, generator=g).bfloat16(), torch.randn(m, k, generator=g), torch.randn(n, generator=g)
    packed = torch.ops.tokenmill.pack_bf16_panels(w)
    y = torch.ops.tokenmill.bf16_panel_linear(x, packed, n, bias)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    # the dot-product path (AVX512_BF16, 3 rows or more) rounds x to bf16 first
    xr = x.bfloat16() if level == "avx512_bf16" and m > 2 else x
    ref = F.linear(xr.double(), w.double(), bias.double())
    assert rel_err(y, ref) < 1e-5
    y_nobias = torch.ops.tokenmill.bf16_panel_linear(x.bfloat16(), packed, n, None)  # bf16 x accepted too
    assert rel_err(y_nobias, F.linear(x.bfloat16().double(), w.double())) < 1e-5


@pytest.mark.parametrize("m", [3, 200])  # 200 x 576 rounds across threads (over 64 K elements)
def test_bf16_dot_product_path_rounds_x_as_torch_does(m, restore_isa):
    """float32 x is rounded to bf16 inside the kernel (vcvtneps2bf16, nearest even): the same bits as
    x.to(torch.bfloat16), so the result equals passing the rounded x (tolerance 0)."""
    if "avx512_bf16" not in cpu_ops.runnable_levels():
        pytest.skip(f"this CPU has no AVX512_BF16 ({cpu_ops.isa()})")
    cpu_ops.set_isa("avx512_bf16")
    g = torch.Generator().manual_seed(m)
    w, x = torch.randn(96, 576, generator=g).bfloat16(), torch.randn(m, 576, generator=g) * 3
    packed = torch.ops.tokenmill.pack_bf16_panels(w)
    assert torch.equal(torch.ops.tokenmill.bf16_panel_linear(x, packed, 96, None),
                       torch.ops.tokenmill.bf16_panel_linear(x.bfloat16(), packed, 96, None))


@pytest.mark.parametrize("level", ["avx512", "avx2"])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 8, 15, 40, 100])
@pytest.mark.parametrize("n", [50, 40, 96])
def test_float32_panel_linear_every_level(level, m, n, restore_isa):
    """From 8 rows AVX-512 takes the panels in pairs: an even count (96), a partial last pair (50: 16 +
    2 columns) and an odd last panel (40: a pair, then 8 columns alone). 1e-5 of the largest output
    against float64."""
    if level not in cpu_ops.runnable_levels():
        pytest.skip(f"this CPU cannot run {level}")
    cpu_ops.set_isa(level)
    g = torch.Generator().manual_seed(m * n)
    w, x, bias = torch.randn(n, 67, generator=g), torch.randn(m, 67, generator=g), torch.randn(n, generator=g)
    y = torch.ops.tokenmill.panel_linear(x, torch.ops.tokenmill.pack_panels(w), n, bias)
    assert rel_err(y, F.linear(x.double(), w.double(), bias.double())) < 1e-5


def _decode_reference(q, cache, tables, lens, block_size, window=0):
    """Float64 softmax attention of each sequence's visible tokens, read from the paged cache."""
    b_, h, d = q.shape
    hkv = cache[0].shape[1]
    out = torch.empty(b_, h, d, dtype=torch.float64)
    for b in range(b_):
        pos = torch.arange(max(0, int(lens[b]) - window) if window else 0, int(lens[b]))
        slots = tables[b][pos // block_size] * block_size + pos % block_size
        k, v = (c[slots].double().repeat_interleave(h // hkv, 1) for c in cache)
        p = (torch.einsum("hd,lhd->hl", q[b].double(), k) * d ** -0.5).softmax(-1)
        out[b] = torch.einsum("hl,lhd->hd", p, v)
    return out


@pytest.mark.parametrize("level", ["avx512", "avx2", "scalar"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 8, 32), (16, 2, 128), (12, 4, 96), (10, 2, 64),
                                              (4, 2, 40)])
def test_paged_decode_every_level(level, dtype, heads, kv_heads, d, restore_isa):
    """Every level against float64 (1e-5 absolute: outputs are averages of N(0, 1) values); 5 query
    heads per KV head and head size 40 have no AVX-512 kernel and take the AVX2 loops on that level.
    Lengths cover a lone token, partial and whole 16-token tiles, and a sliding window."""
    if level not in cpu_ops.runnable_levels():
        pytest.skip(f"this CPU cannot run {level}")
    cpu_ops.set_isa(level)
    g = torch.Generator().manual_seed(heads * d)
    bs, nblocks = 16, 120
    cache = tuple(torch.randn(nblocks * bs, kv_heads, d, generator=g).to(dtype) for _ in range(2))
    lens = torch.tensor([1, 2, 15, 16, 17, 33, 200, 5])
    tables = torch.randperm(nblocks, generator=g)[:8 * 13].view(8, 13).contiguous()
    q = torch.randn(8, heads, d, generator=g)
    threads = torch.get_num_threads()
    try:
        for window in (0, 20):
            # 8 sequences: one per task, on 1 thread, or in ranges of about equal K/V rows on 2 and 3
            # (the 200-token one alone against the seven others); 3 on 2 threads: KV heads split
            for n, t in ((8, 1), (8, 2), (8, 3), (3, 2)):
                torch.set_num_threads(t)
                out = cpu_ops.paged_decode(q[:n], cache, tables[:n], lens[:n], bs, d ** -0.5, window)
                ref = _decode_reference(q[:n], cache, tables[:n], lens[:n], bs, window)
                assert (out.double() - ref).abs().max() < 1e-5
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("level", ["avx512", "avx2", "scalar"])
@pytest.mark.parametrize("kv", ["float32", "bfloat16", "int8", "float8_e4m3fn"])
def test_paged_decode_splits_long_contexts(level, kv, restore_isa):
    """One or two long contexts leave threads idle when tasks are whole KV heads, so their contexts
    are cut into pieces joined by log-sum-exp. Against float64 (1e-5 absolute; the quantized caches
    against their dequantized values) on 1 to 4 threads, with and without a sliding window, beside a
    short sequence; the cut really happens (the bits differ from batch-invariant mode, which never
    cuts, by under 1e-5), and batch-invariant mode gives one sequence the same bits alone and in a
    batch, on any thread count."""
    from tokenmill.attention.kv_cache import dequantize, quantize
    if level not in cpu_ops.runnable_levels():
        pytest.skip(f"this CPU cannot run {level}")
    cpu_ops.set_isa(level)
    g = torch.Generator().manual_seed(7)
    bs, nblocks, heads, kv_heads, d = 16, 600, 9, 3, 64
    raw = [torch.randn(nblocks * bs, kv_heads, d, generator=g) for _ in range(2)]
    if kv in ("int8", "float8_e4m3fn"):
        packed = [quantize(x, getattr(torch, kv)) for x in raw]
        cache = (packed[0][0], packed[1][0], packed[0][1], packed[1][1])
        ref_cache = tuple(dequantize(*p) for p in packed)
    else:
        cache = ref_cache = tuple(x.to(getattr(torch, kv)) for x in raw)
    lens = torch.tensor([3000, 40, 1700])
    tables = torch.randperm(nblocks, generator=g)[:3 * 190].view(3, 190).contiguous()
    q = torch.randn(3, heads, d, generator=g)
    threads = torch.get_num_threads()
    try:
        for window in (0, 700):
            for n, t in ((1, 2), (1, 3), (2, 2), (3, 4), (3, 1)):
                torch.set_num_threads(t)
                out = cpu_ops.paged_decode(q[:n], cache, tables[:n], lens[:n], bs, d ** -0.5, window)
                ref = _decode_reference(q[:n], ref_cache, tables[:n], lens[:n], bs, window)
                assert (out.double() - ref).abs().max() < 1e-5, (window, n, t)
        torch.set_num_threads(2)
        split = cpu_ops.paged_decode(q[:1], cache, tables[:1], lens[:1], bs, d ** -0.5)
        previous = cpu_ops.set_batch_invariant(True)
        try:
            whole = cpu_ops.paged_decode(q[:1], cache, tables[:1], lens[:1], bs, d ** -0.5)
            assert not torch.equal(split, whole) and (split - whole).abs().max() < 1e-5
            for t in (1, 3):
                torch.set_num_threads(t)
                batched = cpu_ops.paged_decode(q, cache, tables, lens, bs, d ** -0.5)
                assert torch.equal(batched[:1], whole)
        finally:
            cpu_ops.set_batch_invariant(previous)
    finally:
        torch.set_num_threads(threads)


def test_set_isa_caps_at_what_the_cpu_has(restore_isa):
    best = cpu_ops.runnable_levels()[0]
    env_cap = os.environ.get("TOKENMILL_CPU_ISA") or "auto"  # auto returns to the process's own cap
    assert cpu_ops.set_isa("auto") == (best if env_cap == "auto" else
                                       cpu_ops.LEVELS[max(cpu_ops.LEVELS.index(best), cpu_ops.LEVELS.index(env_cap))])
    assert cpu_ops.set_isa("scalar") == "scalar"
    assert cpu_ops.isa_level() == "scalar"
    assert cpu_ops.set_isa("avx512_bf16") == best  # never above the CPU
    with pytest.raises(RuntimeError, match="avx512_bf16, avx512, avx2, scalar"):
        cpu_ops.set_isa("sse9")


@pytest.mark.parametrize("level", cpu_ops.LEVELS)
def test_dtype_auto_follows_the_kernel_level(level, restore_isa):
    """bfloat16 at both AVX-512 levels (widened bf16 GEMMs without AVX512_BF16), float32 below;
    explicit dtypes pass through."""
    from tokenmill.engine.resolve import resolve_dtype
    ran = cpu_ops.set_isa(level)
    assert resolve_dtype("auto") == ("bfloat16" if ran in ("avx512_bf16", "avx512") else "float32")
    assert resolve_dtype("float32") == "float32" and resolve_dtype("bfloat16") == "bfloat16"


@pytest.mark.parametrize("level", cpu_ops.LEVELS)
def test_kv_cache_auto_is_bf16_under_auto_float32_weights(level, tiny_llama, tmp_path, restore_isa):
    """dtype auto on AVX2 (float32 weights) takes a bf16 KV cache, as AVX-512 CPUs get with their bf16
    weights; an explicit dtype or kv_cache_dtype, another attention backend, or an MLA model (no
    plain bf16 cache) keep what they ask for."""
    from tiny_models import make_tiny_model
    from tokenmill.config import EngineConfig
    from tokenmill.engine.resolve import resolve_config
    ran = cpu_ops.set_isa(level)
    avx2 = ran in ("avx2", "scalar")

    def kv(model=tiny_llama, **kw):
        return resolve_config(EngineConfig(model=str(model), num_kv_blocks=8, **kw)).cache.kv_cache_dtype
    assert kv() == ("bfloat16" if avx2 else "auto")
    assert kv(dtype="float32") == "auto" and kv(kv_cache_dtype="int8") == "int8"
    assert kv(attention_backend="torch") == "auto"
    mla = make_tiny_model(tmp_path / "mla", "deepseek_v2", seed=3)
    assert kv(model=mla) == "auto"


@pytest.mark.parametrize("has_bf16", [True, False])
def test_dtype_auto_without_kernels_needs_native_bf16(has_bf16, monkeypatch):
    from tokenmill.engine import resolve
    monkeypatch.setattr(cpu_ops, "isa_level", lambda: "unavailable")
    monkeypatch.setattr(resolve, "cpu_has_bf16", lambda: has_bf16)
    assert resolve.resolve_dtype("auto") == ("bfloat16" if has_bf16 else "float32")


def test_env_cap_is_read_at_load():
    """The cap holds for the process: set_isa("auto") after another level returns to it."""
    code = ("from tokenmill.kernels import cpu_ops; cpu_ops.load(); first = cpu_ops.isa_level(); "
            "cpu_ops.set_isa('avx2'); print(first, cpu_ops.set_isa('auto'))")
    env = {**os.environ, "TOKENMILL_CPU_ISA": "scalar"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["scalar", "scalar"]


def test_store_kv_rounds_float32_into_a_bf16_cache_like_torch():
    """Bit-exact with torch's float32 -> bfloat16 conversion (round to nearest even)."""
    cache_k, cache_v = torch.zeros(8, 2, 20, dtype=torch.bfloat16), torch.zeros(8, 2, 20, dtype=torch.bfloat16)
    qkv = torch.randn(3, 2 * 2 * 20) * 100
    qkv[0, :3] = torch.tensor([float("nan"), float("inf"), 1.00390625])  # a tie rounds to even
    k, v = qkv[:, :40].view(3, 2, 20), qkv[:, 40:].view(3, 2, 20)  # strided views, as from the qkv output
    slots = torch.tensor([5, 0, 7])
    want_k, want_v = k.bfloat16(), v.bfloat16()
    torch.ops.tokenmill.store_kv(cache_k, cache_v, k, v, slots)
    # the inputs are rounded in place too: this step's attention sees what the cache holds
    for got, want in ((cache_k[slots], want_k), (cache_v[slots], want_v), (k.bfloat16(), want_k),
                      (v.bfloat16(), want_v)):
        assert torch.equal(got.isnan(), want.isnan())  # NaN stays NaN (its payload may differ)
        finite = ~want.isnan()
        assert torch.equal(got[finite].view(torch.int16), want[finite].view(torch.int16))  # bit-exact otherwise
    assert torch.equal(k[1:], want_k[1:].float())
    assert cache_k[1].abs().sum() == 0  # untouched slots stay zero
    with pytest.raises(RuntimeError, match="outside the cache"):
        torch.ops.tokenmill.store_kv(cache_k, cache_v, k, v, torch.tensor([5, 0, 8]))


def _functions_using_zmm(objdump_text: str) -> set[str]:
    users, current = set(), None
    for line in objdump_text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            current = head.group(1)
        elif current and "zmm" in line:
            users.add(current)
    return users


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not installed")
def test_avx512_code_stays_inside_the_dispatched_functions():
    """An inline function of a shared header compiled under the AVX-512 pragma could be the copy the
    linker keeps for the whole library, and fault on an AVX2-only CPU: none may use zmm registers."""
    if cpu_ops.emulated():
        pytest.skip("the emulated AVX-512 build (SIMDe) has no AVX-512 instructions to look for")
    path = cpu_ops.library_path()
    assert path is not None
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(path)], capture_output=True, text=True,
                          timeout=300, check=True).stdout
    users = _functions_using_zmm(text)
    assert any("tm_avx512" in f for f in users)  # the AVX-512 kernels are there ...
    assert [f for f in users if "tm_avx512" not in f] == []  # ... and nothing else uses AVX-512


def test_onednn_bf16_linear_method_matches_the_panels():
    """The AMX route (oneDNN's prepacked bf16 weight) runs on any CPU where oneDNN does bf16 (AVX-512 BW/VL/DQ
    or AVX-NE-CONVERT); against the bf16
    panels on the same bf16 weight: both round x to bf16 at 3+ rows, bias added in bf16 by oneDNN
    (tolerance 1e-2 relative to the largest output)."""
    from tokenmill.models.linear import Linear
    from tokenmill.quant.unquantized import Bf16PanelLinearMethod, OneDNNBf16LinearMethod, _has_onednn_bf16_linear
    if not _has_onednn_bf16_linear():
        pytest.skip("oneDNN has no bf16 linear on this CPU (needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)")
    g = torch.Generator().manual_seed(3)
    w, b, x = torch.randn(70, 48, generator=g), torch.randn(70, generator=g), torch.randn(9, 48, generator=g)
    outs = []
    for method in (Bf16PanelLinearMethod(), OneDNNBf16LinearMethod()):
        layer = Linear(48, 70, bias=True, quant_method=method)
        with torch.no_grad():
            layer.weight.copy_(w)
            layer.bias.copy_(b)
        method.load(layer)
        outs.append(layer(x))
    assert outs[1].dtype == torch.float32
    assert rel_err(outs[1], outs[0].double()) < 1e-2


@pytest.mark.parametrize("level", cpu_ops.LEVELS)
@pytest.mark.parametrize("m,k,inter", [(1, 576, 64), (2, 33, 32), (3, 576, 96), (7, 33, 32), (13, 128, 64),
                                       (200, 576, 96)])
def test_bf16_swiglu_every_level(level, m, k, inter, restore_isa):
    """silu(x Wg) * (x Wu) from one gate_up panel set against float64 over the same bf16 weights. The
    dot-product path (AVX512_BF16, 3 rows or more) rounds x and the product to bf16: each output within
    one bf16 rounding (2^-8 relative) of the reference over bf16-rounded x, plus 1e-5 of the largest
    output for the float32 sums and the exp polynomial; elsewhere (the widening fused kernel at AVX-512,
    the unfused ops below) float32 out, 1e-5 of the largest."""
    if level not in cpu_ops.runnable_levels():
        pytest.skip(f"this CPU cannot run {level} ({cpu_ops.isa()})")
    assert cpu_ops.set_isa(level) == level
    g = torch.Generator().manual_seed(m * 1000 + k + inter)
    w, x = torch.randn(2 * inter, k, generator=g).bfloat16(), torch.randn(m, k, generator=g)
    y = torch.ops.tokenmill.bf16_swiglu(x, torch.ops.tokenmill.pack_bf16_panels(w), inter)
    fused = level == "avx512_bf16" and m > 2
    assert y.shape == (m, inter) and y.dtype == (torch.bfloat16 if fused else torch.float32)
    gu = F.linear((x.bfloat16() if fused else x).double(), w.double())
    ref = F.silu(gu[:, :inter]) * gu[:, inter:]
    err = (y.double() - ref).abs()
    if fused:
        assert (err <= ref.abs() * 2 ** -8 + 1e-5 * ref.abs().max()).all()
    else:
        assert rel_err(y, ref) < 1e-5


@pytest.mark.parametrize("level", ["avx512_bf16", "avx512"])
@pytest.mark.parametrize("m", [1, 2, 9, 12, 25])  # 25: row blocks of 9, 8 and 8 (12 at most)
def test_bf16_swiglu_widened_equals_the_unfused_ops(level, m, restore_isa):
    """Where bf16_panel_linear widens the weights at AVX-512 (every row count at the avx512 level, one or
    two rows with AVX512_BF16), the fused kernel sums in its order and takes silu_and_mul's exp
    polynomial: the unfused ops' values, float32 (tolerance 0)."""
    if level not in cpu_ops.runnable_levels() or (level == "avx512_bf16" and m > 2):
        pytest.skip(f"{level} with {m} rows is not the widening path on this CPU ({cpu_ops.isa()})")
    cpu_ops.set_isa(level)
    g = torch.Generator().manual_seed(11 + m)
    w, x = torch.randn(192, 77, generator=g).bfloat16(), torch.randn(m, 77, generator=g)
    packed = torch.ops.tokenmill.pack_bf16_panels(w)
    y = torch.ops.tokenmill.bf16_swiglu(x, packed, 96)
    expected = torch.ops.tokenmill.silu_and_mul(torch.ops.tokenmill.bf16_panel_linear(x, packed, 192, None))
    assert y.dtype == torch.float32 and torch.equal(y, expected)


def test_fused_widened_rows_do_not_depend_on_their_batch(restore_isa):
    """At the avx512 level the fused SwiGLU and argmax take every row count through the widening
    kernels: a row's result is the same alone and among 29 rows (tolerance 0; SwiGLU's 29 rows take the
    12-row group kernel, a lone row the 6 x 64 one)."""
    if "avx512" not in cpu_ops.runnable_levels():
        pytest.skip("this CPU has no AVX-512")
    cpu_ops.set_isa("avx512")
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(256, 64, generator=g).bfloat16(), torch.randn(29, 64, generator=g)
    packed = torch.ops.tokenmill.pack_bf16_panels(w)
    together = torch.ops.tokenmill.bf16_swiglu(x, packed, 128)
    ids = torch.ops.tokenmill.bf16_argmax_linear(x, packed, 256, 250)
    for r in (0, 6, 12, 19, 28):
        assert torch.equal(torch.ops.tokenmill.bf16_swiglu(x[r:r + 1], packed, 128)[0], together[r])
        assert torch.equal(torch.ops.tokenmill.bf16_argmax_linear(x[r:r + 1], packed, 256, 250)[0], ids[r])


def test_bf16_swiglu_is_unfused_in_batch_invariant_mode(restore_isa):
    """Batch-invariant mode keeps the one accumulation order of bf16_panel_linear: with AVX512_BF16 the
    unfused ops; at the avx512 level the widening fused kernel, whose values are theirs: float32 out,
    equal to running the unfused ops by hand (tolerance 0)."""
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(128, 48, generator=g).bfloat16(), torch.randn(9, 48, generator=g)
    packed = torch.ops.tokenmill.pack_bf16_panels(w)
    cpu_ops.set_batch_invariant(True)
    try:
        y = torch.ops.tokenmill.bf16_swiglu(x, packed, 64)
        expected = torch.ops.tokenmill.silu_and_mul(torch.ops.tokenmill.bf16_panel_linear(x, packed, 128, None))
    finally:
        cpu_ops.set_batch_invariant(False)
    assert y.dtype == torch.float32 and torch.equal(y, expected)


def test_bf16_swiglu_refuses_a_layout_it_cannot_split():
    packed = torch.ops.tokenmill.pack_bf16_panels(torch.randn(80, 16).bfloat16())
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.tokenmill.bf16_swiglu(torch.randn(4, 16), packed, 40)


@pytest.mark.parametrize("level", cpu_ops.LEVELS)
@pytest.mark.parametrize("m,n,k,n_valid", [(1, 100, 48, 100), (3, 100, 48, 97), (7, 257, 33, 250), (40, 64, 16, 64),
                                           (13, 1000, 64, 999)])
def test_bf16_argmax_linear_matches_the_logits_argmax(level, m, n, k, n_valid, restore_isa):
    """Greedy sampling from the LM head: the same token as bf16_panel_linear's logits cut to n_valid,
    argmax'd (the fused path computes the same dot products, so tolerance 0); ties go to the first
    column, as torch.argmax: duplicated weight rows make exact ties across lanes and panels."""
    if level not in cpu_ops.runnable_levels():
        pytest.skip(f"this CPU cannot run {level}")
    cpu_ops.set_isa(level)
    g = torch.Generator().manual_seed(m * n + k)
    w, x = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g)
    w[n // 2] = w[n // 3 + 1] = w[n - 1]  # the same logit in three columns, far apart
    x[0] = w[n - 1] * 8  # row 0's maximum is that tied triple
    w = w.bfloat16()
    packed = torch.ops.tokenmill.pack_bf16_panels(w)
    ids = torch.ops.tokenmill.bf16_argmax_linear(x, packed, n, n_valid)
    logits = torch.ops.tokenmill.bf16_panel_linear(x, packed, n, None)[:, :n_valid]
    assert ids.dtype == torch.int64 and torch.equal(ids, logits.argmax(-1))
    assert ids[0] == min(n // 3 + 1, n // 2)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("m,n,k", [(40, 192, 64), (27, 576, 48), (12, 64, 40), (11, 320, 32)])
def test_bf16_gemms_share_odd_panel_pairs_by_rows(threads, m, n, k, restore_isa):
    """On the two-panel path a thread count that does not divide the panel pairs (576 columns: 9 pairs
    on 2 threads) cuts the rows too (16 rows or more, csrc/gemm_split.h; 11 and 12 keep whole pairs):
    every row of every pair is computed once. Linear against float64 over bf16-rounded x (1e-5 of the
    largest), SwiGLU within one bf16 rounding, the argmax equal to the logits' argmax (tolerance 0)."""
    if "avx512_bf16" not in cpu_ops.runnable_levels():
        pytest.skip(f"this CPU has no AVX512_BF16 ({cpu_ops.isa()})")
    cpu_ops.set_isa("avx512_bf16")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(m + n + k)
        w, x = torch.randn(n, k, generator=g).bfloat16(), torch.randn(m, k, generator=g)
        packed = torch.ops.tokenmill.pack_bf16_panels(w)
        ref = F.linear(x.bfloat16().double(), w.double())
        assert rel_err(torch.ops.tokenmill.bf16_panel_linear(x, packed, n, None), ref) < 1e-5
        y = torch.ops.tokenmill.bf16_swiglu(x, packed, n // 2)
        sw = F.silu(ref[:, :n // 2]) * ref[:, n // 2:]
        assert ((y.double() - sw).abs() <= sw.abs() * 2 ** -8 + 1e-5 * sw.abs().max()).all()
        ids = torch.ops.tokenmill.bf16_argmax_linear(x, packed, n, n - 3)
        logits = torch.ops.tokenmill.bf16_panel_linear(x, packed, n, None)[:, :n - 3]
        assert torch.equal(ids, logits.argmax(-1))
    finally:
        torch.set_num_threads(before)
