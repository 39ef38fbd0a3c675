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
// CPU SDPA computes the masked scores too, and repeats K/V for GQA).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_isa.h"
#include "gemm_isa.h"
#include "gemm_micro.h"

namespace {

using tokenmill_gemm::NR;

// S = Q K^T and O += P V blocks: the AVX-512 micro-kernel where the CPU has it (gemm_avx512.cpp)
void s_rows(bool avx512, const float* x, int64_t lda, int64_t M, int64_t K, const float* panel, float* y,
            int64_t ldy, int64_t ncols) {
  if (avx512) tm_avx512::f32_panel_rows(x, lda, M, K, panel, nullptr, y, ldy, ncols);
  else tokenmill_gemm::panel_rows<false>(x, lda, M, K, panel, nullptr, y, ldy, ncols);
}

void o_rows(bool avx512, const float* x, int64_t lda, int64_t M, int64_t K, const float* panel, float* y,
            int64_t ldy, int64_t ncols) {
  if (avx512) tm_avx512::f32_panel_rows_acc(x, lda, M, K, panel, y, ldy, ncols);
  else tokenmill_gemm::panel_rows<true>(x, lda, M, K, panel, nullptr, y, ldy, ncols);
}

constexpr int64_t QB = 32;  // queries per task and head
constexpr int64_t KB = 64;  // keys per block (4 panels)

struct Scratch {
  std::vector<float> q, s, o, m, l;
};

// exp(s[j] - mx) for j < n in place, 0 for n <= j < width; returns the sum of the first n.
inline float exp_row(float* s, int64_t n, int64_t width, float mx) {
  const float sum = exp_sub_sum(s, n, mx);
  std::fill(s + n, s + width, 0.f);
  return sum;
}

// kp: this KV head's keys packed transposed, [Lk/16][D][16]; vp: its values, [D/16][Lk16][16].
void attend_block(const float* q, const float* kp, const float* vp, int64_t Lk16, float* out, int64_t context,
                  int64_t q0, int64_t nq, int64_t h, int64_t G, int64_t D, const int64_t qs[2], int64_t H,
                  float scale, Scratch& w) {
  const int64_t M = G * nq, dpanels = (D + NR - 1) / NR;
  const bool avx512 = tokenmill_isa::active_level() >= tokenmill_isa::Level::kAvx512;
  w.q.resize(M * D);
  w.s.resize(M * KB);
  w.o.assign(M * D, 0.f);
  w.m.assign(M, -std::numeric_limits<float>::infinity());
  w.l.assign(M, 0.f);
  for (int64_t g = 0; g < G; ++g)  // row g * nq + i: query q0 + i of head h * G + g, pre-scaled
    for (int64_t i = 0; i < nq; ++i) {
      const float* src = q + (q0 + i) * qs[0] + (h * G + g) * qs[1];
      float* dst = w.q.data() + (g * nq + i) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * scale;
    }
  const int64_t kend = context + q0 + nq;  // keys any row of this block may see
  for (int64_t kb0 = 0; kb0 < kend; kb0 += KB) {
    const int64_t nk = std::min(KB, kend - kb0);
    for (int64_t p = 0; p * NR < nk; ++p)
      s_rows(avx512, w.q.data(), D, M, D, kp + (kb0 / NR + p) * D * NR, w.s.data() + p * NR, KB,
             std::min(NR, nk - p * NR));
    for (int64_t r = 0; r < M; ++r) {
      const int64_t pos = context + q0 + r % nq;                        // the row's absolute position
      const int64_t n = std::clamp<int64_t>(pos - kb0 + 1, 0, nk);     // keys it may see in this block
      float* s = w.s.data() + r * KB;
      if (n == 0) {
        std::fill(s, s + nk, 0.f);
        continue;
      }
      const float mx = std::max(w.m[r], row_max(s, n));
      const float alpha = std::exp(w.m[r] - mx);
      w.l[r] = w.l[r] * alpha + exp_row(s, n, nk, mx);
      w.m[r] = mx;
      if (alpha != 1.f) {
        float* o = w.o.data() + r * D;
        for (int64_t d = 0; d < D; ++d) o[d] *= alpha;
      }
    }
    for (int64_t p = 0; p < dpanels; ++p)
      o_rows(avx512, w.s.data(), KB, M, nk, vp + (p * Lk16 + kb0) * NR, w.o.data() + p * NR, D,
             std::min(NR, D - p * NR));
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t r = g * nq + i;
      const float inv = 1.f / w.l[r];
      const float* o = w.o.data() + r * D;
      float* dst = out + ((q0 + i) * H + h * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = o[d] * inv;
    }
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t context,
                             double scale) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "float32 only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.sizes() == v.sizes(), "q [Lq, H, D], k/v [Lk, Hkv, D]");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1, "the last dimension must be contiguous");
  const int64_t Lq = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1);
  TORCH_CHECK(k.size(2) == D && Hkv > 0 && H % Hkv == 0, "head shapes do not match");
  TORCH_CHECK(context >= 0 && k.size(0) == context + Lq, "k/v must hold context + Lq keys");
  auto out = at::empty({Lq, H, D}, q.options());
  if (Lq == 0) return out;
  const int64_t G = H / Hkv, qblocks = (Lq + QB - 1) / QB, tasks = Hkv * qblocks;
  const int64_t qs[2] = {q.stride(0), q.stride(1)};
  // Pack every KV head's keys (transposed) and values into 16-wide panels once; tasks share them.
  const int64_t Lk = k.size(0), Lk16 = (Lk + NR - 1) / NR * NR, dpanels = (D + NR - 1) / NR;
  std::vector<float> kpack(Hkv * Lk16 * D, 0.f), vpack(Hkv * dpanels * Lk16 * NR, 0.f);
  const float* kptr = k.data_ptr<float>();
  const float* vptr = v.data_ptr<float>();
  at::parallel_for(0, Hkv * (Lk16 / NR), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t / (Lk16 / NR), kp0 = (t % (Lk16 / NR)) * NR;
      float* kdst = kpack.data() + h * Lk16 * D + kp0 * D;               // [D][16] of keys kp0..kp0+15
      float* vdst = vpack.data() + h * dpanels * Lk16 * NR;              // [dpanel][Lk16][16]
      for (int64_t j = kp0; j < std::min(kp0 + NR, Lk); ++j) {
        const float* kr = kptr + j * k.stride(0) + h * k.stride(1);
        const float* vr = vptr + j * v.stride(0) + h * v.stride(1);
        for (int64_t d = 0; d < D; ++d) kdst[d * NR + (j - kp0)] = kr[d];
        for (int64_t d = 0; d < D; ++d) vdst[((d / NR) * Lk16 + j) * NR + d % NR] = vr[d];
      }
    }
  });
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    Scratch w;
    for (int64_t t = begin; t < end; ++t) {
      // zig-zag over query blocks (0, last, 1, last-1, ...): contiguous thread ranges get equal work
      const int64_t h = t % Hkv, z = t / Hkv, qb = z % 2 == 0 ? z / 2 : qblocks - 1 - z / 2;
      const int64_t q0 = qb * QB;
      attend_block(qp, kpack.data() + h * Lk16 * D, vpack.data() + h * dpanels * Lk16 * NR, Lk16, op, context, q0,
                   std::min(QB, Lq - q0), h, G, D, qs, H, s, w);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tokenmill, m) {
  m.def("prefill_attention(Tensor q, Tensor k, Tensor v, int context, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokenmill, CPU, m) { m.impl("prefill_attention", &prefill_attention); }
