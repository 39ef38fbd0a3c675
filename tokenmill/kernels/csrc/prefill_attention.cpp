// Causal prefill attention of one sequence's chunk, float32, GQA, flash-style (online softmax).
//
// q [Lq, H, D]: the chunk's queries, at absolute positions context .. context + Lq - 1;
// k, v [Lk, Hkv, D] with Lk = context + Lq: every key of the sequence so far. Query i sees keys
// 0 .. context + i. Any of them may be strided views (the fused qkv output) with a contiguous last
// dimension. Output [Lq, H, D] contiguous.
//
// One task per (KV head, block of QB queries): the G query heads sharing the KV head are stacked
// into M = G * QB rows. K and V are packed once per call into 16-wide panels (K transposed), so
// per key block of KB keys S = Q K^T and O += P V run on the GEMM micro-kernel of the linear
// layers; keys past the diagonal are never multiplied beyond the one block that crosses it (torch's
// CPU SDPA computes the masked scores too, and repeats K/V for GQA). One softmax for all three paths
// (base 2, a lazily moved max): AVX2 float32; AVX-512 float32 (panels two at a time); AVX512_BF16 for
// bf16 caches (vdpbf16ps). A bf16 cache's K/V on the float32 paths are widened as
// they are packed.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_isa.h"
#include "decode_isa.h"
#include "gemm_isa.h"
#include "gemm_micro.h"
#include "ops.h"

namespace {

using tokenmill_gemm::NR;
constexpr int64_t BC = tokenmill_gemm::kBf16PanelCols;        // keys (S) or dims (O) per bf16 panel
constexpr int64_t PS = tokenmill_gemm::kBf16PanelPairStride;  // uint16 per k-pair row of a bf16 panel

// float32 -> bf16 bits, rounded to nearest even (finite values: scores and scaled queries)
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

constexpr float kLog2e = 1.44269504088896341f;
constexpr int64_t QB = 32;  // queries per task and head
constexpr int64_t KB = 128;  // keys per block (four bf16 panels, eight float32 ones)

// One task's working set: its M = G * nq query rows (row g * nq + i: query q0 + i of head h * G + g).
struct Scratch {
  std::vector<float> q, s, o, m, l;
  std::vector<uint16_t> qb, pb;  // bf16 path: q rows, and the block's softmax numerators

  // o is not zeroed: key block 0 writes it (every row sees key 0, so block 0 covers every row)
  void start(int64_t M, int64_t D) {
    q.resize(M * D);
    s.resize(M * KB);
    o.resize(M * D);
    m.assign(M, -std::numeric_limits<float>::infinity());
    l.assign(M, 0.f);
  }
  // out rows = o / l
  void finish(float* out, int64_t q0, int64_t nq, int64_t h, int64_t G, int64_t D, int64_t H) const {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t r = g * nq + i;
        const float inv = 1.f / l[r];
        const float* src = o.data() + r * D;
        float* dst = out + ((q0 + i) * H + h * G + g) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * inv;
      }
  }
};

// The task's query rows, pre-scaled, into dst [M][D].
void gather_q(const float* q, int64_t q0, int64_t nq, int64_t h, int64_t G, int64_t D, const int64_t qs[2],
              float scale, float* dst) {
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < nq; ++i) {
      const float* src = q + (q0 + i) * qs[0] + (h * G + g) * qs[1];
      float* row = dst + (g * nq + i) * D;
      for (int64_t d = 0; d < D; ++d) row[d] = src[d] * scale;
    }
}

// How far (log2 units) a row's block max may rise above the max its numerators are taken against
// before o and l are rescaled: numerators stay <= 2^8, exact enough in bf16 and far from overflow, and
// o / l is the same whichever max was used. Most blocks then skip the rescale (and its exp).
constexpr float kLazyRescaleLog2 = 8.f;

// The row operations of softmax_block_lazy on each ISA: the block max of a row's first n scores, and
// their numerators 2^(s - mx) written in place (0 past n) with their sum returned.
struct Avx2Rows {
  static float max(const float* s, int64_t n) { return row_max(s, n); }
  static float exp2_sub(float* s, int64_t n, int64_t width, float mx) { return exp2_sub_row(s, n, width, mx); }
};
struct Avx512Rows {
  static float max(const float* s, int64_t n) { return tm_avx512::row_max(s, n); }
  static float exp2_sub(float* s, int64_t n, int64_t width, float mx) {
    return tm_avx512::exp2_sub_row(s, n, width, mx);
  }
};

// Online softmax over one key block [kb0, kb0 + nk) of scores w.s [M][KB] in log2 units (q pre-scaled
// by log2 e); row r (query position pos0 + r % nq) sees the keys up to its own position. The
// numerators 2^(s - m) go to w.pb as bf16 (BF16, AVX512_BF16 only: w.s is left as is) or replace the
// scores in w.s (float32, 0 past what the row sees); m, l and o move only when a row's block max
// exceeds m by more than kLazyRescaleLog2 (always on its first block: m = -inf).
template <typename Rows, bool BF16 = false>
void softmax_block_lazy(Scratch& w, int64_t M, int64_t nq, int64_t D, int64_t pos0, int64_t kb0, int64_t nk) {
  for (int64_t r = 0; r < M; ++r) {
    const int64_t n = std::clamp<int64_t>(pos0 + r % nq - kb0 + 1, 0, nk);
    float* s = w.s.data() + r * KB;
    uint16_t* p = w.pb.data() + r * KB;
    if (n == 0) {
      if constexpr (BF16) std::fill(p, p + nk, uint16_t{0});
      else std::fill(s, s + nk, 0.f);
      continue;
    }
    const float bm = Rows::max(s, n);
    if (bm > w.m[r] + kLazyRescaleLog2) {
      if (kb0 > 0) {  // on block 0, l is 0 and o is written, not accumulated, after this
        const float alpha = std::exp2(w.m[r] - bm);
        w.l[r] *= alpha;
        float* o = w.o.data() + r * D;
        for (int64_t d = 0; d < D; ++d) o[d] *= alpha;
      }
      w.m[r] = bm;
    }
    if constexpr (BF16) w.l[r] += tm_avx512_bf16::exp2_round_row(s, n, nk, w.m[r], p);
    else w.l[r] += Rows::exp2_sub(s, n, nk, w.m[r]);
  }
}

// kp: this KV head's keys packed transposed, [Lk/16][D][16]; vp: its values, [D/16][Lk16][16]. AVX2:
// S = Q K^T and O += P V one 16-wide panel at a time (6 x 16 blocks: 2 panel loads and 6 broadcasts
// per 12 FMAs, FMA-bound already), the base-2 softmax with a lazily moved max, key block 0 writing O.
void attend_block(const float* q, const float* kp, const float* vp, int64_t Lk16, float* out, int64_t context,
                  int64_t q0, int64_t nq, int64_t h, int64_t G, int64_t D, const int64_t qs[2], int64_t H,
                  float scale, Scratch& w) {
  const int64_t M = G * nq, dpanels = (D + NR - 1) / NR;
  w.start(M, D);
  gather_q(q, q0, nq, h, G, D, qs, scale * kLog2e, w.q.data());  // scores in log2 units
  const int64_t kend = context + q0 + nq;  // keys any row of this block may see
  for (int64_t kb0 = 0; kb0 < kend; kb0 += KB) {
    const int64_t nk = std::min(KB, kend - kb0);
    for (int64_t p = 0; p * NR < nk; ++p)
      tokenmill_gemm::panel_rows<false>(w.q.data(), D, M, D, kp + (kb0 / NR + p) * D * NR, nullptr,
                                        w.s.data() + p * NR, KB, std::min(NR, nk - p * NR));
    softmax_block_lazy<Avx2Rows>(w, M, nq, D, context + q0, kb0, nk);
    const auto pv = kb0 == 0 ? &tokenmill_gemm::panel_rows<false> : &tokenmill_gemm::panel_rows<true>;
    for (int64_t p = 0; p < dpanels; ++p)
      pv(w.s.data(), KB, M, nk, vp + (p * Lk16 + kb0) * NR, nullptr, w.o.data() + p * NR, D, std::min(NR, D - p * NR));
  }
  w.finish(out, q0, nq, h, G, D, H);
}

// attend_block on AVX-512 (float32 math): S = Q K^T and O += P V with the panels two at a time (one
// broadcast of q or p per two FMAs: the single-panel kernel waits on the load ports, session 31), the
// softmax in base 2 with a lazily moved max (softmax_block_lazy) and key block 0 writing O.
void attend_block_avx512(const float* q, const float* kp, const float* vp, int64_t Lk16, float* out,
                         int64_t context, int64_t q0, int64_t nq, int64_t h, int64_t G, int64_t D,
                         const int64_t qs[2], int64_t H, float scale, Scratch& w) {
  const int64_t M = G * nq;
  w.start(M, D);
  gather_q(q, q0, nq, h, G, D, qs, scale * kLog2e, w.q.data());  // scores in log2 units
  const int64_t kend = context + q0 + nq;
  for (int64_t kb0 = 0; kb0 < kend; kb0 += KB) {
    const int64_t nk = std::min(KB, kend - kb0);
    tm_avx512::f32_panels_rows(w.q.data(), D, M, D, kp + kb0 * D, D * NR, w.s.data(), KB, nk, false);
    softmax_block_lazy<Avx512Rows>(w, M, nq, D, context + q0, kb0, nk);
    tm_avx512::f32_panels_rows(w.s.data(), KB, M, nk, vp + kb0 * NR, Lk16 * NR, w.o.data(), D, D, kb0 > 0);
  }
  w.finish(out, q0, nq, h, G, D, H);
}

// bf16 path (AVX512_BF16 CPUs, bf16 KV caches): q and the softmax numerators rounded to bf16, S = Q K^T
// and O += P V on vdpbf16ps (the linear layers' bf16 panel kernel), softmax (base 2, lazily rescaled)
// and O in float32.
// kp: this KV head's keys in bf16 panels of 32 keys, [Lk32/32][D2][32][2] (pairs along D);
// vp: its values in panels of 32 dims, [D32/32][Lk2][32][2] (pairs along the keys).
void attend_block_bf16(const float* q, const uint16_t* kp, const uint16_t* vp, int64_t Lk2, float* out,
                       int64_t context, int64_t q0, int64_t nq, int64_t h, int64_t G, int64_t D, const int64_t qs[2],
                       int64_t H, float scale, Scratch& w) {
  const int64_t M = G * nq, D2 = (D + 1) / 2, dpanels = (D + BC - 1) / BC;
  w.start(M, D);
  gather_q(q, q0, nq, h, G, D, qs, scale * kLog2e, w.q.data());  // scores in log2 units
  w.qb.resize(M * D);
  w.pb.resize(M * KB);
  tm_avx512_bf16::round_to_bf16(w.q.data(), w.qb.data(), M * D);
  const int64_t kend = context + q0 + nq;
  for (int64_t kb0 = 0; kb0 < kend; kb0 += KB) {
    const int64_t nk = std::min(KB, kend - kb0);
    for (int64_t p = 0; p * BC < nk; ++p)
      tm_avx512_bf16::bf16_panel_rows(w.qb.data(), D, M, D, kp + (kb0 / BC + p) * D2 * PS, nullptr,
                                      w.s.data() + p * BC, KB, std::min(BC, nk - p * BC));
    softmax_block_lazy<Avx512Rows, true>(w, M, nq, D, context + q0, kb0, nk);
    for (int64_t p = 0; p < dpanels; ++p) {
      const uint16_t* vpanel = vp + (p * Lk2 + kb0 / 2) * PS;
      float* o = w.o.data() + p * BC;
      if (kb0 == 0)
        tm_avx512_bf16::bf16_panel_rows(w.pb.data(), KB, M, nk, vpanel, nullptr, o, D, std::min(BC, D - p * BC));
      else
        tm_avx512_bf16::bf16_panel_rows_acc(w.pb.data(), KB, M, nk, vpanel, o, D, std::min(BC, D - p * BC));
    }
  }
  w.finish(out, q0, nq, h, G, D, H);
}

// Element (row j, head h, dim d) of a float32 or bf16 [L, Hkv, D] view, as bf16 bits.
struct Bf16Source {
  const void* data;
  int64_t s0, s1;
  bool bf16;
  explicit Bf16Source(const at::Tensor& t)
      : data(t.data_ptr()), s0(t.stride(0)), s1(t.stride(1)), bf16(t.scalar_type() == at::kBFloat16) {}
  // row j of head h: D contiguous values of type T (uint16_t bf16 bits, or float)
  template <typename T>
  const T* row(int64_t j, int64_t h) const { return static_cast<const T*>(data) + j * s0 + h * s1; }
  uint16_t operator()(int64_t j, int64_t h, int64_t d) const {
    return bf16 ? row<uint16_t>(j, h)[d] : bf16_bits(row<float>(j, h)[d]);
  }
};

// Keys j0 .. j1 - 1 (one panel, j0 even) into the panels of prefill_bf16, as 32-bit words; row(j) is key
// j's D bf16 values (the same row of K or V: krow / vrow). A key's (d, d + 1) pair is one word of its row
// (K panel row d / 2, lane j - j0); a V word holds dim d of keys j and j + 1 (low half: the even key; past
// the last key, the packs' zero fill).
template <typename KRow, typename VRow>
void pack_words(const KRow& krow, const VRow& vrow, int64_t j0, int64_t j1, int64_t D, int64_t Lk2, uint16_t* kdst,
                uint16_t* vdst) {
  auto* kw = reinterpret_cast<uint32_t*>(kdst);
  auto* vw = reinterpret_cast<uint32_t*>(vdst);
  for (int64_t j = j0; j < j1; ++j) {
    const uint16_t* row = krow(j);
    for (int64_t d2 = 0; d2 < D / 2; ++d2) {
      uint32_t w;
      std::memcpy(&w, row + 2 * d2, 4);
      kw[d2 * (PS / 2) + (j - j0)] = w;
    }
  }
  for (int64_t j = j0; j < j1; j += 2) {
    const uint16_t* a = vrow(j);
    const uint16_t* b = j + 1 < j1 ? vrow(j + 1) : nullptr;
    for (int64_t d0 = 0; d0 < D; d0 += BC) {
      uint32_t* dst = vw + ((d0 / BC) * Lk2 + j / 2) * (PS / 2);
      const int64_t nd = std::min(BC, D - d0);
      if (b != nullptr)
        for (int64_t d = 0; d < nd; ++d) dst[d] = uint32_t(a[d0 + d]) | (uint32_t(b[d0 + d]) << 16);
      else
        for (int64_t d = 0; d < nd; ++d) dst[d] = a[d0 + d];
    }
  }
}

// Runs `task(h, q0, nq)` for every (KV head, block of QB queries), zig-zag over the query blocks
// (0, last, 1, last-1, ...) so that contiguous thread ranges get equal work.
template <typename Task>
void for_query_blocks(int64_t Hkv, int64_t Lq, const Task& task) {
  const int64_t qblocks = (Lq + QB - 1) / QB;
  at::parallel_for(0, Hkv * qblocks, 1, [&](int64_t begin, int64_t end) {
    Scratch w;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t % Hkv, z = t / Hkv, qb = z % 2 == 0 ? z / 2 : qblocks - 1 - z / 2;
      task(w, h, qb * QB, std::min(QB, Lq - qb * QB));
    }
  });
}

void prefill_bf16(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t context, float scale,
                  at::Tensor& out) {
  const int64_t Lq = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), G = H / Hkv, Lk = k.size(0);
  const int64_t kpanels = (Lk + BC - 1) / BC, D2 = (D + 1) / 2, dpanels = (D + BC - 1) / BC, Lk2 = (Lk + 1) / 2;
  const int64_t kstride = kpanels * D2 * PS, vstride = dpanels * Lk2 * PS;  // uint16 per KV head
  std::vector<uint16_t> kpack(Hkv * kstride, 0), vpack(Hkv * vstride, 0);
  const Bf16Source kb(k), vb(v);
  // bf16 rows: packed as 32-bit words; float32 rows (a fresh prompt's own k/v, which store_kv rounded to
  // bf16 values): a panel's rows rounded to bf16 with AVX-512 first, then packed the same way
  const bool words = kb.bf16 && vb.bf16 && D % 2 == 0;
  const bool f32_rows = !kb.bf16 && !vb.bf16 && D % 2 == 0;
  at::parallel_for(0, Hkv * kpanels, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> krows, vrows;  // f32_rows: the panel's keys and values in bf16, [j - j0][D]
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t / kpanels, j0 = (t % kpanels) * BC, j1 = std::min(j0 + BC, Lk);
      uint16_t* kdst = kpack.data() + h * kstride + (j0 / BC) * D2 * PS;  // [D2][32][2] of keys j0..j0+31
      uint16_t* vdst = vpack.data() + h * vstride;                           // [dpanel][Lk2][32][2]
      if (words) {
        pack_words([&](int64_t j) { return kb.row<uint16_t>(j, h); },
                   [&](int64_t j) { return vb.row<uint16_t>(j, h); }, j0, j1, D, Lk2, kdst, vdst);
        continue;
      }
      if (f32_rows) {
        krows.resize(BC * D);
        vrows.resize(BC * D);
        for (int64_t j = j0; j < j1; ++j) {
          tm_avx512_bf16::round_to_bf16(kb.row<float>(j, h), krows.data() + (j - j0) * D, D);
          tm_avx512_bf16::round_to_bf16(vb.row<float>(j, h), vrows.data() + (j - j0) * D, D);
        }
        pack_words([&](int64_t j) { return krows.data() + (j - j0) * D; },
                   [&](int64_t j) { return vrows.data() + (j - j0) * D; }, j0, j1, D, Lk2, kdst, vdst);
        continue;
      }
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t d = 0; d < D; ++d) {
          kdst[(d / 2) * PS + (j - j0) * 2 + (d & 1)] = kb(j, h, d);
          vdst[((d / BC) * Lk2 + j / 2) * PS + (d % BC) * 2 + (j & 1)] = vb(j, h, d);
        }
    }
  });
  const int64_t qs[2] = {q.stride(0), q.stride(1)};
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for_query_blocks(Hkv, Lq, [&](Scratch& w, int64_t h, int64_t q0, int64_t nq) {
    attend_block_bf16(qp, kpack.data() + h * kstride, vpack.data() + h * vstride, Lk2, op, context, q0, nq, h, G, D,
                      qs, H, scale, w);
  });
}

// T: float, or c10::BFloat16 (a bf16 cache's context on a CPU without AVX512_BF16: widened as packed)
template <typename T>
void prefill_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t context, float scale,
                 at::Tensor& out) {
  const int64_t Lq = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), G = H / Hkv;
  // Pack every KV head's keys (transposed) and values into 16-wide panels once; tasks share them.
  const int64_t Lk = k.size(0), Lk16 = (Lk + NR - 1) / NR * NR, dpanels = (D + NR - 1) / NR;
  std::vector<float> kpack(Hkv * Lk16 * D, 0.f), vpack(Hkv * dpanels * Lk16 * NR, 0.f);
  const T* kptr = k.data_ptr<T>();
  const T* vptr = v.data_ptr<T>();
  at::parallel_for(0, Hkv * (Lk16 / NR), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t / (Lk16 / NR), kp0 = (t % (Lk16 / NR)) * NR;
      float* kdst = kpack.data() + h * Lk16 * D + kp0 * D;               // [D][16] of keys kp0..kp0+15
      float* vdst = vpack.data() + h * dpanels * Lk16 * NR;              // [dpanel][Lk16][16]
      for (int64_t j = kp0; j < std::min(kp0 + NR, Lk); ++j) {
        const T* kr = kptr + j * k.stride(0) + h * k.stride(1);
        const T* vr = vptr + j * v.stride(0) + h * v.stride(1);
        for (int64_t d = 0; d < D; ++d) kdst[d * NR + (j - kp0)] = static_cast<float>(kr[d]);
        for (int64_t d = 0; d < D; ++d) vdst[((d / NR) * Lk16 + j) * NR + d % NR] = static_cast<float>(vr[d]);
      }
    }
  });
  const int64_t qs[2] = {q.stride(0), q.stride(1)};
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const bool avx512 = tokenmill_isa::active_level() >= tokenmill_isa::Level::kAvx512;
  for_query_blocks(Hkv, Lq, [&](Scratch& w, int64_t h, int64_t q0, int64_t nq) {
    const float* kh = kpack.data() + h * Lk16 * D;
    const float* vh = vpack.data() + h * dpanels * Lk16 * NR;
    if (avx512) attend_block_avx512(qp, kh, vh, Lk16, op, context, q0, nq, h, G, D, qs, H, scale, w);
    else attend_block(qp, kh, vh, Lk16, op, context, q0, nq, h, G, D, qs, H, scale, w);
  });
}

}  // namespace

namespace tokenmill_ops {

// k/v float32 or bfloat16. bf16_math: the caller accepts q and the softmax numerators rounded to bf16
// (a bf16 model, whose K/V are bf16 in the cache already); taken where the CPU has AVX512_BF16.
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t context,
                             double scale, bool bf16_math) {
  TORCH_CHECK(q.scalar_type() == at::kFloat, "q: float32");
  TORCH_CHECK(k.scalar_type() == v.scalar_type() && (k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16),
              "k/v: both float32 or both bfloat16");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.sizes() == v.sizes(), "q [Lq, H, D], k/v [Lk, Hkv, D]");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1, "the last dimension must be contiguous");
  const int64_t Lq = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1);
  TORCH_CHECK(k.size(2) == D && Hkv > 0 && H % Hkv == 0, "head shapes do not match");
  TORCH_CHECK(context >= 0 && k.size(0) == context + Lq, "k/v must hold context + Lq keys");
  auto out = new_tensor({Lq, H, D}, q.options());
  if (Lq == 0) return out;
  const float s = static_cast<float>(scale);
  if (bf16_math && tokenmill_isa::active_level() == tokenmill_isa::Level::kAvx512Bf16)
    prefill_bf16(q, k, v, context, s, out);
  else if (k.scalar_type() == at::kFloat)
    prefill_f32<float>(q, k, v, context, s, out);
  else
    prefill_f32<c10::BFloat16>(q, k, v, context, s, out);
  return out;
}

}  // namespace tokenmill_ops
