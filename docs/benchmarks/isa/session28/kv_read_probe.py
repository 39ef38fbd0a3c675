"""How fast can 2 threads read KV rows from DRAM in decode order (per sequence, block-table order) with no
arithmetic: in row order, in the decode kernel's tile order, over a head-major block layout, with software
prefetch at several distances, and against plain sequential reads.
python docs/benchmarks/isa/session28/kv_read_probe.py  (env B, L, HUGE as dec_probe.py)"""
import os, time, torch
from torch.utils.cpp_extension import load_inline
src = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

int64_t read_rows(torch::Tensor cache, torch::Tensor slots, torch::Tensor offs, int64_t row_bytes, int64_t dist, int64_t hint, int64_t fmas, int64_t tiled) {
  const char* base = (const char*)cache.data_ptr(); const int64_t* s = slots.data_ptr<int64_t>(); const int64_t* o = offs.data_ptr<int64_t>();
  const int64_t B = offs.numel() - 1; std::atomic<int64_t> tot{0};
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    __m512 acc = _mm512_setzero_ps(); __m512 f = _mm512_set1_ps(1.0001f);
    for (int64_t b = b0; b < b1; ++b) {
      if (tiled) {  // the decode kernel's order: tiles of 16 rows, 3 heads' 128-byte pieces in turn; a burst of prefetches 32 rows ahead per tile
        for (int64_t t0 = o[b]; t0 < o[b + 1]; t0 += 16) {
          const int64_t n = std::min<int64_t>(16, o[b + 1] - t0);
          if (dist > 0) for (int64_t t = t0 + dist; t < std::min(o[b + 1], t0 + dist + 16); ++t) {
            if (tiled == 2) { for (int64_t h = 0; h < 3; ++h) { const char* p = base + ((s[t] / 32 * 3 + h) * 32 + s[t] % 32) * 128;
              _mm_prefetch(p, _MM_HINT_T1); _mm_prefetch(p + 64, _MM_HINT_T1); } continue; }
            const char* p = base + s[t] * row_bytes;
            for (int64_t off = 0; off < row_bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1); }
          for (int64_t h = 0; h < 3; ++h) for (int64_t i = 0; i < n; ++i) {
            // tiled == 2: a head-major block layout, [block][head][32 tokens][D]: slot s -> block s / 32, token s % 32
            const char* r = tiled == 2 ? base + ((s[t0 + i] / 32 * 3 + h) * 32 + s[t0 + i] % 32) * 128 : base + s[t0 + i] * row_bytes + h * 128;
            acc = _mm512_add_ps(acc, _mm512_loadu_ps((const float*)r)); acc = _mm512_add_ps(acc, _mm512_loadu_ps((const float*)(r + 64)));
            for (int64_t j = 0; j < fmas; ++j) acc = _mm512_fmadd_ps(acc, f, acc); }
        }
        continue;
      }
      for (int64_t t = o[b]; t < o[b + 1]; ++t) {
        if (dist > 0 && t + dist < o[b + 1]) { const char* p = base + s[t + dist] * row_bytes;
          for (int64_t off = 0; off < row_bytes; off += 64) { if (hint == 1) _mm_prefetch(p + off, _MM_HINT_T1); else if (hint == 0) _mm_prefetch(p + off, _MM_HINT_T0); else _mm_prefetch(p + off, _MM_HINT_T2);} }
        const char* r = base + s[t] * row_bytes;
        for (int64_t off = 0; off < row_bytes; off += 64) acc = _mm512_add_ps(acc, _mm512_loadu_ps((const float*)(r + off)));
        for (int64_t i = 0; i < fmas; ++i) acc = _mm512_fmadd_ps(acc, f, acc);
      }
    }
    tot += (int64_t)_mm512_reduce_add_ps(acc);
  });
  return tot;
}
'''
m = load_inline("kv_read_probe_s28c", cpp_sources=src, functions=["read_rows"], extra_cflags=["-O3", "-fopenmp", "-march=native"], verbose=False)
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
Hkv, D, bs = 3, 64, 32
B = int(os.environ.get("B", 64)); L = int(os.environ.get("L", 30))
lens = torch.randint(64, 700, (B,), generator=g)
nb = int(((lens + bs - 1) // bs).sum())
from tokenmill.host_memory import lazy_zeros
def mk():
    t = lazy_zeros(nb * bs * Hkv * D * 2, huge=bool(int(os.environ.get("HUGE", 0)))); t.fill_(1); return t
caches = [mk() for _ in range(2 * L)]
def layout(seq):
    perm = torch.arange(nb) if seq else torch.randperm(nb, generator=g)
    slots, offs, o = [], [0], 0
    for b in range(B):
        n = int(lens[b]); blocks = perm[o:o + (n + bs - 1) // bs]; o += len(blocks)
        slots += [int(blocks[t // bs]) * bs + t % bs for t in range(n)]; offs.append(len(slots))
    return torch.tensor(slots), torch.tensor(offs)
row = Hkv * D * 2
byts = int(lens.sum()) * row * 2 * L
# (name, blocks in sequence order, prefetch distance in rows, hint 0=T0 1=T1, FMAs per row or piece, tiled:
# 0 = rows in order, 1 = the decode kernel's order (16-row tiles, heads in turn), 2 = that order over a head-major layout)
CASES = [("tiled (kernel order), T1 burst 32 ahead", 0, 32, 1, 0, 1),
         ("tiled, head-major blocks, T1 burst 32 ahead", 0, 32, 1, 0, 2),
         ("tiled, head-major blocks, no prefetch", 0, 0, 1, 0, 2),
         ("tiled, no prefetch", 0, 0, 1, 0, 1),
         ("tiled, T1 burst 16 ahead", 0, 16, 1, 0, 1),
         ("tiled, T1 burst 32 ahead, +8 fma/piece", 0, 32, 1, 8, 1),
         ("random blocks, no prefetch", 0, 0, 1, 0, 0),
         ("random, T1 16 ahead", 0, 16, 1, 0, 0),
         ("random, T1 48 ahead", 0, 48, 1, 0, 0),
         ("random, T0 16 ahead", 0, 16, 0, 0, 0),
         ("sequential blocks, no prefetch", 1, 0, 1, 0, 0),
         ("random, no prefetch, +24 fma/row", 0, 0, 1, 24, 0),
         ("random, T1 32, +24 fma/row", 0, 32, 1, 24, 0)]
def best_of(f, reps=4):
    best = 9
    for _ in range(reps):
        t = time.perf_counter(); f(); best = min(best, time.perf_counter() - t)
    return best
for r in range(2):
  for name, seq, dist, hint, fm, tiled in CASES:
    slots, offs = layout(seq)
    best = best_of(lambda: [m.read_rows(c, slots, offs, row, dist, hint, fm, tiled) for c in caches])
    print(f"{name:36s} {byts / best / 1e9:5.1f} GB/s")
x = torch.ones(1 << 29, dtype=torch.bfloat16)
best = best_of(x.sum)
print(f"{'x.sum() over 1 GiB':36s} {x.numel() * 2 / best / 1e9:5.1f} GB/s")
