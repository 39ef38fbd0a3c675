"""Our fused C++ layer ops against the PyTorch formulas they replace (float32; tolerance 1e-5
relative: same math, different summation order and a polynomial exp with ~2 ulp error)."""
import pytest
import torch
import torch.nn.functional as F

from tokenmill.kernels import cpu_ops

pytestmark = pytest.mark.skipif(not cpu_ops.load(), reason="C++ kernels unavailable here")
TOL = dict(atol=1e-5, rtol=1e-5)


def ref_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("rows,dim", [(1, 576), (37, 64), (300, 100)])
def test_rms_norm_and_fused_add(rows, dim):
    g = torch.Generator().manual_seed(rows)
    x, res, w = torch.randn(rows, dim, generator=g), torch.randn(rows, dim, generator=g), torch.randn(dim, generator=g)
    torch.testing.assert_close(torch.ops.tokenmill.rms_norm(x, w, 1e-5), ref_norm(x, w, 1e-5), **TOL)
    want_res = res + x
    want = ref_norm(want_res, w, 1e-6)
    torch.ops.tokenmill.fused_add_rms_norm(x, res, w, 1e-6)
    torch.testing.assert_close(res, want_res, atol=0, rtol=0)
    torch.testing.assert_close(x, want, **TOL)


@pytest.mark.parametrize("rows,inter", [(1, 1536), (5, 13), (64, 40)])
def test_silu_and_mul_including_extremes(rows, inter):
    gu = torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 4
    gu[0, :4] = torch.tensor([-100.0, 100.0, -88.5, 0.0])  # exp over/underflow must not give NaN
    gate, up = gu.split(inter, dim=-1)
    out = torch.ops.tokenmill.silu_and_mul(gu)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.silu(gate) * up, **TOL)


def test_rotary_in_place_on_strided_views():
    t, h, hkv, d = 9, 4, 2, 16
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=torch.Generator().manual_seed(1))
    q, k, _ = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(t, h, d), k.view(t, hkv, d)
    angles = torch.rand(t, d // 2) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def ref(x):
        rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
        return x * cos[:, None] + rot * sin[:, None]
    want_q, want_k, v_before = ref(q.clone()), ref(k.clone()), qkv[:, (h + hkv) * d:].clone()
    torch.ops.tokenmill.rotary_(q, cos, sin)
    torch.ops.tokenmill.rotary_(k, cos, sin)
    torch.testing.assert_close(q, want_q, **TOL)
    torch.testing.assert_close(k, want_k, **TOL)
    assert torch.equal(qkv[:, (h + hkv) * d:], v_before)  # v untouched


def test_bad_input_is_refused_with_a_message():
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.tokenmill.rms_norm(torch.ones(2, 4, dtype=torch.float64), torch.ones(4), 1e-5)
    with pytest.raises(RuntimeError, match="weight does not match"):
        torch.ops.tokenmill.rms_norm(torch.ones(2, 4), torch.ones(5), 1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13, 97, 200])
@pytest.mark.parametrize("k", [576, 37])  # a multiple of 16 and a ragged tail
def test_panel_linear_matches_matmul(rows, k):
    """Every row-block size (1-6), several 96-row chunks, and a ragged last panel (300 = 18*16 + 12)."""
    g = torch.Generator().manual_seed(rows * k)
    x, w, b = torch.randn(rows, k, generator=g), torch.randn(300, k, generator=g), torch.randn(300, generator=g)
    packed = torch.ops.tokenmill.pack_panels(w)
    assert packed.shape == (19, k, 16)
    torch.testing.assert_close(torch.ops.tokenmill.panel_linear(x, packed, 300, b), x @ w.t() + b, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(torch.ops.tokenmill.panel_linear(x, packed, 300, None), x @ w.t(), atol=1e-4, rtol=1e-5)
    assert torch.ops.tokenmill.panel_linear(x[:0], packed, 300, None).shape == (0, 300)
    with pytest.raises(RuntimeError, match="does not hold N columns"):
        torch.ops.tokenmill.panel_linear(x, packed, 200, None)
    with pytest.raises(RuntimeError, match="x \\[M, K\\]"):
        torch.ops.tokenmill.panel_linear(torch.randn(rows, k + 1), packed, 300, None)


@pytest.mark.parametrize("method", ["PanelLinearMethod", "OneDNNLinearMethod", "PlainLinearMethod"])
def test_linear_quant_methods_match_reference(method):
    """Each unquantized method through the Linear seam: fused shards loaded by the per-parameter
    loader, packed by load(), applied; float32 tolerance 1e-4."""
    from tokenmill.models.linear import Linear
    from tokenmill.quant import unquantized
    g = torch.Generator().manual_seed(0)
    lin = Linear(40, [30, 40], bias=True, quant_method=getattr(unquantized, method)(), prefix="fused")
    shards = [torch.randn(30, 40, generator=g), torch.randn(40, 40, generator=g)]
    for i, w in enumerate(shards):
        lin.load_weight("weight", w, shard=i)
    b = torch.randn(70, generator=g)
    lin.load_weight("bias", b)
    lin.quant_method.load(lin)
    if method != "PlainLinearMethod":
        assert lin.packed is not None and lin.weight.is_meta and lin.weight.shape == (70, 40)
    x = torch.randn(9, 40, generator=g)
    torch.testing.assert_close(lin(x), x @ torch.cat(shards).t() + b, atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="fused.weight: checkpoint shape"):
        lin.load_weight("weight", torch.randn(31, 40), shard=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_matches_index_copy(dtype):
    """Strided k/v (slices of a fused qkv output, as in the model) land at their slots, nothing else moves."""
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, 9 * 64 + 2 * 3 * 64, generator=g).to(dtype)
    k = qkv[:, 576:768].view(5, 3, 64)
    v = qkv[:, 768:].view(5, 3, 64)
    assert not k.is_contiguous()
    slots = torch.tensor([7, 0, 31, 8, 15])
    caches = [torch.randn(32, 3, 64, generator=g).to(dtype) for _ in range(2)]
    expect = [c.clone().index_copy_(0, slots, x) for c, x in zip(caches, (k, v))]
    torch.ops.tokenmill.store_kv(caches[0], caches[1], k, v, slots)
    assert torch.equal(caches[0], expect[0]) and torch.equal(caches[1], expect[1])
    with pytest.raises(RuntimeError, match="outside the cache"):
        torch.ops.tokenmill.store_kv(caches[0], caches[1], k, v, torch.tensor([0, 1, 2, 3, 32]))
    with pytest.raises(RuntimeError, match="cache's dtype"):
        torch.ops.tokenmill.store_kv(caches[0], caches[1], k.double(), v.double(), slots)


def sdpa_causal(q, k, v, context, scale):
    lq, lk = q.shape[0], k.shape[0]
    mask = torch.arange(lk)[None, :] <= (context + torch.arange(lq))[:, None]
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


@pytest.mark.parametrize("lq,context,heads,kv_heads,d", [
    (1, 0, 9, 3, 64), (37, 0, 9, 3, 64), (300, 0, 9, 3, 64),  # one key; partial blocks; many blocks
    (100, 50, 4, 2, 16), (129, 200, 8, 8, 24), (65, 0, 6, 1, 8), (5, 70, 3, 3, 40)])  # context, odd D
@pytest.mark.parametrize("isa", ["auto", "avx2"])
def test_prefill_attention_matches_sdpa(lq, context, heads, kv_heads, d, isa):
    """Causal attention of a chunk after `context` cached keys, q/k/v strided slices of one fused
    tensor as the model hands them over; float32 tolerance 1e-5. `auto` runs the AVX-512
    micro-kernel where the CPU has it, `avx2` the baseline one."""
    cpu_ops.set_isa(isa)
    try:
        _check_prefill_attention(lq, context, heads, kv_heads, d)
    finally:
        cpu_ops.set_isa("auto")


def _check_prefill_attention(lq, context, heads, kv_heads, d):
    g = torch.Generator().manual_seed(lq + context)
    fused = torch.randn(context + lq, (heads + 2 * kv_heads) * d, generator=g)
    q = fused[context:, :heads * d].view(lq, heads, d)
    k = fused[:, heads * d:(heads + kv_heads) * d].view(context + lq, kv_heads, d)
    v = fused[:, (heads + kv_heads) * d:].view(context + lq, kv_heads, d)
    out = torch.ops.tokenmill.prefill_attention(q, k, v, context, d ** -0.5)
    torch.testing.assert_close(out, sdpa_causal(q, k, v, context, d ** -0.5), **TOL)
    with pytest.raises(RuntimeError, match="context \\+ Lq keys"):
        torch.ops.tokenmill.prefill_attention(q, k, v, context + 1, d ** -0.5)


@pytest.mark.parametrize("lq,context,heads,kv_heads,d", [
    (1, 0, 9, 3, 64), (300, 0, 9, 3, 64), (100, 50, 4, 2, 16), (129, 200, 8, 8, 24), (65, 0, 6, 1, 8),
    (77, 33, 4, 2, 30)])
@pytest.mark.parametrize("isa", ["auto", "avx2"])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float32])
def test_prefill_attention_bf16_math(lq, context, heads, kv_heads, d, isa, kv_dtype):
    """bf16_math=True (a bf16 cache): on AVX512_BF16 CPUs q and the softmax numerators are rounded to
    bf16 and the products run on vdpbf16ps, checked against float64 attention over the same bf16
    K/V with atol/rtol 2e-2 (measured: max error 0.005 on unit-normal inputs); elsewhere (`avx2`, or
    a CPU without it) the float32 path runs, 1e-5. K/V come as the cache's bf16 or as float32 rows
    already rounded to bf16 (a fresh prompt's own k/v)."""
    g = torch.Generator().manual_seed(7 * lq + context)
    q = torch.randn(lq, heads, d, generator=g)
    k, v = (torch.randn(context + lq, kv_heads, d, generator=g).bfloat16() for _ in range(2))
    ref = sdpa_causal(q.double(), k.double(), v.double(), context, d ** -0.5).float()
    cpu_ops.set_isa(isa)
    try:
        out = torch.ops.tokenmill.prefill_attention(q, k.to(kv_dtype), v.to(kv_dtype), context, d ** -0.5, True)
        bf16_math = cpu_ops.isa_level() == "avx512_bf16"
    finally:
        cpu_ops.set_isa("auto")
    torch.testing.assert_close(out, ref, **(dict(atol=2e-2, rtol=2e-2) if bf16_math else TOL))
    if bf16_math:  # the rounding shows: the float32 path is closer
        f32 = torch.ops.tokenmill.prefill_attention(q, k.float(), v.float(), context, d ** -0.5, False)
        assert (f32 - ref).abs().max() < (out - ref).abs().max() or lq == 1


@pytest.mark.parametrize("jump", [5.0, 6.2, 150.0])
@pytest.mark.parametrize("math,isa", [("bf16", "auto"), ("float32", "auto"), ("float32", "avx2")])
def test_prefill_attention_running_max_jumps(jump, math, isa):
    """Every path (bf16 math; float32 math on AVX-512 since session 31 and on AVX2 since session 32)
    takes its numerators against a running max that may lag the true one by up to 8 (log2 units) and
    rescales o and l only past that. One key (position 150, in the second 128-key block) scores `jump`
    above all others (natural units): 5.0 stays under the threshold (7.2 in log2: numerators up to
    2^7.2, no rescale), 6.2 crosses it (8.9: rescale, while the first block's keys keep ~17% of the
    weight, so a wrong rescale factor shows), 150 would overflow float32 without the rescale. Checked
    against float64 attention, atol/rtol 2e-2 for bf16 math, float32's 1e-5 otherwise."""
    if math == "bf16" and cpu_ops.isa_level() != "avx512_bf16":
        pytest.skip("the bf16 path runs on AVX512_BF16 CPUs only")
    lq, heads, kv_heads, d = 300, 4, 2, 32
    g = torch.Generator().manual_seed(11)
    q = torch.zeros(lq, heads, d)
    q[..., 0] = d ** 0.5  # score of key j = k[j, 0]
    k = (0.3 * torch.randn(lq, kv_heads, d, generator=g)).bfloat16()
    k[..., 0] = 0
    k[150, :, 0] = jump
    v = torch.randn(lq, kv_heads, d, generator=g).bfloat16()
    cpu_ops.set_isa(isa)
    try:
        out = torch.ops.tokenmill.prefill_attention(q, k, v, 0, d ** -0.5, math == "bf16")
    finally:
        cpu_ops.set_isa("auto")
    ref = sdpa_causal(q.double(), k.double(), v.double(), 0, d ** -0.5).float()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **(dict(atol=2e-2, rtol=2e-2) if math == "bf16" else TOL))


@pytest.mark.parametrize("lq,context,heads,kv_heads,d", [
    (1, 0, 9, 3, 64), (37, 0, 9, 3, 64), (200, 130, 9, 3, 64), (33, 0, 4, 2, 30), (20, 11, 3, 1, 7)])
def test_prefill_attention_bf16_views_pack_like_float32_rows(lq, context, heads, kv_heads, d):
    """bf16 K/V views of one fused bf16 tensor (the model's qkv output; odd key counts, D = 30, odd D)
    are packed as 32-bit words; float32 rows holding the same values (contiguous, and as views of a
    float32 fused tensor, as the engine passes a fresh prompt's k/v) are rounded to bf16 row by row
    (AVX-512 for even D, per element for odd D) and packed the same way. Both feed the same bf16 math,
    so the outputs must be identical (exact equality); float32 values off the bf16 grid must give what
    torch's round-to-nearest-even bf16 cast of them gives."""
    g = torch.Generator().manual_seed(lq + 3 * context + d)
    fused = torch.randn(context + lq, (heads + 2 * kv_heads) * d, generator=g).bfloat16()

    def split(t):
        return (t[:, heads * d:(heads + kv_heads) * d].view(context + lq, kv_heads, d),
                t[:, (heads + kv_heads) * d:].view(context + lq, kv_heads, d))
    q = fused[context:, :heads * d].view(lq, heads, d).float()
    k, v = split(fused)
    views = torch.ops.tokenmill.prefill_attention(q, k, v, context, d ** -0.5, True)
    rows = torch.ops.tokenmill.prefill_attention(q, k.float(), v.float(), context, d ** -0.5, True)
    assert torch.equal(views, rows)
    kf, vf = split(fused.float())
    assert torch.equal(views, torch.ops.tokenmill.prefill_attention(q, kf, vf, context, d ** -0.5, True))
    if cpu_ops.isa_level() == "avx512_bf16":  # elsewhere float32 math, which keeps the raw values
        kr, vr = split(torch.randn(context + lq, (heads + 2 * kv_heads) * d, generator=g))  # off the bf16 grid
        assert torch.equal(torch.ops.tokenmill.prefill_attention(q, kr, vr, context, d ** -0.5, True),
                           torch.ops.tokenmill.prefill_attention(q, kr.bfloat16(), vr.bfloat16(), context, d ** -0.5,
                                                                 True))
    ref = sdpa_causal(q.double(), k.double(), v.double(), context, d ** -0.5).float()
    torch.testing.assert_close(views, ref, atol=2e-2, rtol=2e-2)
