"""The AVX-512 decode kernel (decode_avx512.cpp with rdtsc counters around its passes and a variant
switch, edited in at run time into a temporary copy) over B sequences of 64-700 tokens in random 32-token blocks,
bf16, 9 heads / 3 KV heads / D 64, 2 threads: GB/s of K/V read, and the K pass / softmax / V pass split.
L=30 layers' caches: read from DRAM; L=1 with B=24 (7 MB): from cache. Variant 1 prefetches the V
pass's first two tiles before the softmax. Outputs are checked equal across variants.
    python docs/benchmarks/isa/session28/dec_harness.py   (env B, L, VARIANTS=0,1; AHEAD=n prefetches n tiles
    ahead instead of 2, session 29; give each build its own TAG)"""
import os, sys, tempfile, time, torch
from torch.utils.cpp_extension import load_inline
CS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../../tokenmill/kernels/csrc")
src = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <atomic>
#include "HERE/dec_variant_timed.cpp"
std::vector<double> run(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor slots, torch::Tensor offs, torch::Tensor bounds, int64_t G, double scale, int64_t variant, torch::Tensor out) {
  tm_probe::VARIANT = variant;
  const int64_t Hkv = k.size(1), D = k.size(2), H = q.size(1);
  const int64_t* s = slots.data_ptr<int64_t>(); const int64_t* o = offs.data_ptr<int64_t>(); const int64_t* bd = bounds.data_ptr<int64_t>();
  std::atomic<uint64_t> K{0}, S{0}, V{0};
  at::parallel_for(0, bounds.numel() - 1, 1, [&](int64_t f, int64_t l) {
    std::vector<float> scratch;
    tm_probe::tk = tm_probe::ts = tm_probe::tv = 0;
    for (int64_t b = bd[f]; b < bd[l]; ++b) {
      const int64_t len = o[b + 1] - o[b];
      scratch.resize(tm_avx512::decode_scratch_floats(G, len, D, Hkv));
      tm_next::warm = b > bd[f]; tm_next::slots = b + 1 < bd[l] ? s + o[b + 1] : nullptr; tm_next::len = b + 1 < bd[l] ? o[b + 2] - o[b + 1] : 0;
      tm_avx512::decode_heads(q.data_ptr<float>() + b * H * D, k.data_ptr(), v.data_ptr(), true, s + o[b], len, out.data_ptr<float>() + b * H * D, G, Hkv, 0, Hkv, D, (float)scale, scratch.data());
    }
    K += tm_probe::tk; S += tm_probe::ts; V += tm_probe::tv;
  });
  return {double(K), double(S), double(V)};
}
'''
def timed_copy() -> str:
    s = open(os.environ.get("SRC") or os.path.join(CS, "decode_avx512.cpp")).read()  # SRC: a variant file (session 30)
    edits = [('#include "decode_isa.h"', '#include "decode_isa.h"\n#include <x86intrin.h>\nnamespace tm_probe { inline int VARIANT = 0; '
              'inline thread_local uint64_t tk = 0, ts = 0, tv = 0; }'),
             ('  std::fill(o, o + nh * per_head, 0.f);\n', '  std::fill(o, o + nh * per_head, 0.f);\n  uint64_t c0 = __rdtsc();\n'),
             ('  float inv[8 * 128];', '  uint64_t c1 = __rdtsc();\n  if (tm_probe::VARIANT == 1) prefetch_rows(v, slots, std::min(2 * TB, len), row);\n  float inv[8 * 128];'),
             ('inv[r] = softmax_numerators(s + r * len, len);', 'inv[r] = softmax_numerators(s + r * len, len);\n  uint64_t c2 = __rdtsc();'),
             ('  for (int64_t r = 0; r < nh * G; ++r) {\n    float* outr', '  uint64_t c3 = __rdtsc(); tm_probe::tk += c1 - c0; tm_probe::ts += c2 - c1; tm_probe::tv += c3 - c2;\n'
              '  for (int64_t r = 0; r < nh * G; ++r) {\n    float* outr')]
    ahead = int(os.environ.get("AHEAD", 2))  # tiles prefetched ahead (session 29; the kernel's is 2)
    if ahead != 2:
        edits += [("const int64_t a = std::min(len, t0 + 2 * TB); prefetch_rows(k,",
                   f"const int64_t a = std::min(len, t0 + {ahead} * TB); prefetch_rows(k,"),
                  ("const int64_t a = std::min(len, t0 + 2 * TB); prefetch_rows(v,",
                   f"const int64_t a = std::min(len, t0 + {ahead} * TB); prefetch_rows(v,")]
    if os.environ.get("NOPF"):  # no software prefetch at all (session 30)
        edits.append(("  const int64_t bytes = row_elems * int64_t(sizeof(T));\n", "  return;\n  const int64_t bytes = row_elems * int64_t(sizeof(T));\n"))
    for old, new in edits:
        assert s.count(old) == 1, f"decode_avx512.cpp changed: {old!r}"
        s = s.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), "dec_variant_timed.cpp")
    open(path, "w").write(s)
    return path
src = src.replace("HERE/dec_variant_timed.cpp", timed_copy())
m = load_inline("dec_harness_" + os.environ.get("TAG", "v"), cpp_sources=src, functions=["run"], extra_cflags=["-O3", "-fopenmp", f"-I{CS}", "-mavx2", "-mfma", "-mf16c"], verbose=False)
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
H, Hkv, D, bs = 9, 3, 64, 32
B = int(os.environ.get("B", 64)); L = int(os.environ.get("L", 30))
lens = torch.randint(64, 700, (B,), generator=g)
nb = int(((lens + bs - 1) // bs).sum())
from tokenmill.host_memory import lazy_zeros
def mk():
    t = lazy_zeros(nb * bs * Hkv * D * 2, huge=False).view(torch.bfloat16).view(nb * bs, Hkv, D)
    t.copy_(torch.randn(nb * bs, Hkv, D, generator=g)); return t
caches = [(mk(), mk()) for _ in range(L)]
perm = torch.randperm(nb, generator=g)
slots, offs, o = [], [0], 0
for b in range(B):
    n = int(lens[b]); blocks = perm[o:o + (n + bs - 1) // bs]; o += len(blocks)
    slots += [int(blocks[t // bs]) * bs + t % bs for t in range(n)]; offs.append(len(slots))
slots, offs = torch.tensor(slots), torch.tensor(offs)
cum = torch.cumsum(lens + 32, 0); half = int((cum < cum[-1] / 2).sum())
bounds = torch.tensor([0, half, B])
q = torch.randn(B, H, D, generator=g)
out = torch.empty_like(q)
byts = int(lens.sum()) * Hkv * D * 2 * 2 * L
variants = [int(x) for x in os.environ.get("VARIANTS", "0,1").split(",")]
ref = None
for r in range(3):
    for var in variants:
        best, split = 9, None
        for _ in range(4):
            t = time.perf_counter(); tot = [0, 0, 0]
            for kc, vc in caches:
                c = m.run(q, kc, vc, slots, offs, bounds, 3, D ** -0.5, var, out); tot = [a + b for a, b in zip(tot, c)]
            dt = time.perf_counter() - t
            if dt < best: best, split = dt, tot
        if ref is None: ref = out.clone()
        assert torch.equal(out, ref), "variant changed the output"
        ssum = sum(split)
        print(f"variant {var}: {best / L * 1e6:6.0f} us/layer {byts / best / 1e9:5.1f} GB/s  K {split[0]/ssum*100:4.1f}% softmax {split[1]/ssum*100:4.1f}% V {split[2]/ssum*100:4.1f}%")
