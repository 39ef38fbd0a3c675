// AVX-512 GEMM row kernels (gemm_isa.h). This unit is compiled for AVX-512 by the target pragma
// below whatever the build's baseline, and only called when the running CPU has the instructions
// (gemm_dispatch.cpp). Standard headers come before the pragma so their inline functions keep the
// baseline ISA: the linker may pick any copy of those for the whole library.
//
// Register blocking: an MR x 16 or MR x 32 block of y stays in zmm accumulators over all of K;
// with few rows, S independent accumulator sets over interleaved k hide the FMA latency.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu_isa.h"
#include "gemm_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx512_intrinsics.h"

TM_AVX512_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include "exp512.h"

// Named (not anonymous) so that tests/test_cpu_isa.py can check in the built library that AVX-512
// instructions appear only in functions of the tm_avx512* namespaces.
namespace tm_avx512_detail {

using tokenmill_gemm::kBf16PanelPairStride;

constexpr int sets_for(int mr) { return mr <= 2 ? 4 : (mr <= 4 ? 2 : 1); }

inline __mmask16 cols_mask(int64_t ncols) {
  return ncols >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << std::max<int64_t>(ncols, 0)) - 1);
}

// y row (16 columns at most, masked) = acc + bias (ACC: y += acc + bias)
template <bool ACC = false>
inline void store16(float* y, const float* bias, __m512 acc, int64_t ncols) {
  const __mmask16 m = cols_mask(ncols);
  if (m == 0) return;
  if (bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, bias));
  if constexpr (ACC) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, y));
  _mm512_mask_storeu_ps(y, m, acc);
}

inline __m512i bcast_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

inline __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
}

// bf16 x bf16 -> f32 through vdpbf16ps: each instruction does 16 columns x one k-pair (ACC: y += ...,
// for prefill attention's O += P V).
template <int MR, int S = sets_for(MR), bool ACC = false>
void bf16_dp_kernel(const uint16_t* x, int64_t lda, int64_t K, const uint16_t* p, const float* bias, float* y,
                    int64_t ldy, int64_t ncols) {
  __m512 c0[S][MR], c1[S][MR];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < MR; ++r) c0[s][r] = c1[s][r] = _mm512_setzero_ps();
  const int64_t full = K / 2;
  int64_t kk = 0;
  for (; kk + S <= full; kk += S) {
    const uint16_t* pk = p + kk * kBf16PanelPairStride;
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(pk + s * kBf16PanelPairStride) + 1024, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(pk + s * kBf16PanelPairStride) + 1088, _MM_HINT_T0);
      const __m512i b0 = _mm512_loadu_si512(pk + s * kBf16PanelPairStride);
      const __m512i b1 = _mm512_loadu_si512(pk + s * kBf16PanelPairStride + 32);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512i a = bcast_pair(x + r * lda + 2 * (kk + s));
        c0[s][r] = dp(c0[s][r], a, b0);
        c1[s][r] = dp(c1[s][r], a, b1);
      }
    }
  }
  for (; kk < full; ++kk) {
    const uint16_t* pk = p + kk * kBf16PanelPairStride;
    const __m512i b0 = _mm512_loadu_si512(pk), b1 = _mm512_loadu_si512(pk + 32);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512i a = bcast_pair(x + r * lda + 2 * kk);
      c0[0][r] = dp(c0[0][r], a, b0);
      c1[0][r] = dp(c1[0][r], a, b1);
    }
  }
  if (K & 1) {  // the last k pairs with the panel's zero padding
    const uint16_t* pk = p + full * kBf16PanelPairStride;
    const __m512i b0 = _mm512_loadu_si512(pk), b1 = _mm512_loadu_si512(pk + 32);
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_set1_epi32(x[r * lda + K - 1]);
      c0[0][r] = dp(c0[0][r], a, b0);
      c1[0][r] = dp(c1[0][r], a, b1);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    for (int s = 1; s < S; ++s) {
      c0[0][r] = _mm512_add_ps(c0[0][r], c0[s][r]);
      c1[0][r] = _mm512_add_ps(c1[0][r], c1[s][r]);
    }
    store16<ACC>(y + r * ldy, bias, c0[0][r], ncols);
    store16<ACC>(y + r * ldy + 16, bias ? bias + 16 : nullptr, c1[0][r], ncols - 16);
  }
}

// Two panels at once through vdpbf16ps: an MR x 64 block (p0's 32 columns, then p1's) in 4
// accumulators per row, MR <= 6 (24 of the 32 zmm). Each broadcast of x feeds four dot products
// instead of two: 10 loads per 24 vdpbf16ps against 14 for bf16_dp_kernel's 12 x 32 block, measured
// 1.1x faster on the default model's shapes (docs/BENCHMARKS.md). acc[r][0..3] = columns 0-15,
// 16-31 (p0), 32-47, 48-63 (p1).
template <int MR, int S>
__attribute__((always_inline)) inline void dp2_accumulate(const uint16_t* x, int64_t lda, int64_t K,
                                                          const uint16_t* p0, const uint16_t* p1,
                                                          __m512 (&acc)[MR][4]) {
  __m512 c[S][MR][4];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < 4; ++j) c[s][r][j] = _mm512_setzero_ps();
  const int64_t full = K / 2;
  auto step = [&](int s, int64_t kk, bool last_odd) __attribute__((always_inline)) {
    const uint16_t* a0 = p0 + kk * kBf16PanelPairStride;
    const uint16_t* a1 = p1 + kk * kBf16PanelPairStride;
    if (!last_odd) {
      _mm_prefetch(reinterpret_cast<const char*>(a0) + 1024, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a0) + 1088, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a1) + 1024, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a1) + 1088, _MM_HINT_T0);
    }
    const __m512i b[4] = {_mm512_loadu_si512(a0), _mm512_loadu_si512(a0 + 32), _mm512_loadu_si512(a1),
                          _mm512_loadu_si512(a1 + 32)};
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      // the last k of an odd K pairs with the panels' zero padding
      const __m512i a = last_odd ? _mm512_set1_epi32(x[r * lda + K - 1]) : bcast_pair(x + r * lda + 2 * kk);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) c[s][r][j] = dp(c[s][r][j], a, b[j]);
    }
  };
  int64_t kk = 0;
  for (; kk + S <= full; kk += S) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) step(s, kk + s, false);
  }
  for (; kk < full; ++kk) step(0, kk, false);
  if (K & 1) step(0, full, true);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) {
      acc[r][j] = c[0][r][j];
      for (int s = 1; s < S; ++s) acc[r][j] = _mm512_add_ps(acc[r][j], c[s][r][j]);
    }
}

constexpr int dp2_sets(int mr) { return mr == 1 ? 2 : 1; }

// y[MR, ncols <= 64] = x . [p0 | p1] (+ bias)
template <int MR>
void bf16_dp2_kernel(const uint16_t* x, int64_t lda, int64_t K, const uint16_t* p0, const uint16_t* p1,
                     const float* bias, float* y, int64_t ldy, int64_t ncols) {
  __m512 acc[MR][4];
  dp2_accumulate<MR, dp2_sets(MR)>(x, lda, K, p0, p1, acc);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) store16(y + r * ldy + 16 * j, bias ? bias + 16 * j : nullptr, acc[r][j], ncols - 16 * j);
}

// SwiGLU: y[MR, ncols <= 32] (bf16) = silu(x . pg) * (x . pu), for the down projection, which rounds
// its input to bf16 anyway. silu as silu_and_mul computes it (g / (1 + exp(-g)), the same exp).
template <int MR>
void bf16_swiglu_kernel(const uint16_t* x, int64_t lda, int64_t K, const uint16_t* pg, const uint16_t* pu,
                        uint16_t* y, int64_t ldy, int64_t ncols) {
  __m512 acc[MR][4];
  dp2_accumulate<MR, dp2_sets(MR)>(x, lda, K, pg, pu, acc);
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 2; ++j) {
      const __m512 g = acc[r][j], u = acc[r][j + 2];
      const __m512 den = _mm512_add_ps(one, tm_avx512_math::exp512(_mm512_sub_ps(zero, g)));
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_div_ps(g, den), u));
      const __mmask16 m = cols_mask(ncols - 16 * j);
      if (m) _mm256_mask_storeu_epi16(y + r * ldy + 16 * j, m, reinterpret_cast<const __m256i&>(h));
    }
}

// Greedy sampling's LM head: an MR x 64 block of logits (bf16_dp2_kernel's arithmetic, so the same
// values) folded into each row's running best per lane: best_v/best_i [MR][16], lane l having seen
// columns = l (mod 16) in increasing order; a strictly greater value replaces, so each lane keeps the
// first column of its maximum. Columns at or past n_valid are skipped.
template <int MR>
void bf16_argmax_kernel(const uint16_t* x, int64_t lda, int64_t K, const uint16_t* p0, const uint16_t* p1,
                        int64_t n0, int64_t n_valid, float* best_v, int32_t* best_i) {
  __m512 acc[MR][4];
  dp2_accumulate<MR, dp2_sets(MR)>(x, lda, K, p0, p1, acc);
  const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __mmask16 valid = cols_mask(n_valid - n0 - 16 * j);
    if (!valid) break;
    const __m512i cols = _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int32_t>(n0 + 16 * j)));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 bv = _mm512_loadu_ps(best_v + 16 * r);
      const __mmask16 gt = valid & _mm512_cmp_ps_mask(acc[r][j], bv, _CMP_GT_OQ);
      _mm512_storeu_ps(best_v + 16 * r, _mm512_mask_blend_ps(gt, bv, acc[r][j]));
      _mm512_storeu_si512(best_i + 16 * r, _mm512_mask_blend_epi32(gt, _mm512_loadu_si512(best_i + 16 * r), cols));
    }
  }
}

// bf16 weights widened to f32 in registers (AVX-512F without BF16): lane j of a pair row holds
// (w[k][j], w[k+1][j]); shifting left by 16 gives w[k] and masking the low half gives w[k+1].
template <int MR>
void bf16_widen_kernel(const float* x, int64_t lda, int64_t K, const uint16_t* p, const float* bias, float* y,
                       int64_t ldy, int64_t ncols) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  const __m512i hi = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const int64_t pairs = (K + 1) / 2;
  for (int64_t kk = 0; kk < pairs; ++kk) {
    const uint16_t* pk = p + kk * kBf16PanelPairStride;
    _mm_prefetch(reinterpret_cast<const char*>(pk) + 1024, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(pk) + 1088, _MM_HINT_T0);
    const __m512i v0 = _mm512_loadu_si512(pk), v1 = _mm512_loadu_si512(pk + 32);
    const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)), o0 = _mm512_castsi512_ps(_mm512_and_si512(v0, hi));
    const __m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16)), o1 = _mm512_castsi512_ps(_mm512_and_si512(v1, hi));
    const bool odd = 2 * kk + 1 < K;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * lda + 2 * kk]);
      c0[r] = _mm512_fmadd_ps(a, e0, c0[r]);
      c1[r] = _mm512_fmadd_ps(a, e1, c1[r]);
      if (odd) {
        const __m512 a2 = _mm512_set1_ps(x[r * lda + 2 * kk + 1]);
        c0[r] = _mm512_fmadd_ps(a2, o0, c0[r]);
        c1[r] = _mm512_fmadd_ps(a2, o1, c1[r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    store16(y + r * ldy, bias, c0[r], ncols);
    store16(y + r * ldy + 16, bias ? bias + 16 : nullptr, c1[r], ncols - 16);
  }
}

// float32 panels P[K][16]: one zmm of weights per k (ACC: add into y, for attention's O += P V)
template <int MR, bool ACC, int S = sets_for(MR)>
void f32_kernel(const float* x, int64_t lda, int64_t K, const float* p, const float* bias, float* y, int64_t ldy,
                int64_t ncols) {
  __m512 c[S][MR];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < MR; ++r) c[s][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + S <= K; k += S) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(p + (k + s) * 16) + 1024, _MM_HINT_T0);
      const __m512 b = _mm512_loadu_ps(p + (k + s) * 16);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) c[s][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * lda + k + s]), b, c[s][r]);
    }
  }
  for (; k < K; ++k) {
    const __m512 b = _mm512_loadu_ps(p + k * 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) c[0][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * lda + k]), b, c[0][r]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    for (int s = 1; s < S; ++s) c[0][r] = _mm512_add_ps(c[0][r], c[s][r]);
    store16<ACC>(y + r * ldy, bias, c[0][r], ncols);
  }
}

// M rows in blocks of at most MAX rows, as even as possible (13 -> 7 + 6): fn(first row, rows).
template <int MAX, typename Fn>
inline void for_row_blocks(int64_t M, Fn&& fn) {
  if (M <= 0) return;
  const int64_t nblocks = (M + MAX - 1) / MAX, base = M / nblocks, extra = M % nblocks;
  for (int64_t blk = 0, r0 = 0; blk < nblocks; ++blk) {
    const int64_t rows = base + (blk < extra ? 1 : 0);
    fn(r0, rows);
    r0 += rows;
  }
}

// ... each block through KERNEL<rows>.
template <int MAX, typename X, typename P, typename Kernel>
inline void row_blocks(const X* x, int64_t lda, int64_t M, int64_t K, const P* panel, const float* bias, float* y,
                       int64_t ldy, int64_t ncols, const Kernel* kernels) {
  for_row_blocks<MAX>(M, [&](int64_t r0, int64_t rows) {
    kernels[rows](x + r0 * lda, lda, K, panel, bias, y + r0 * ldy, ldy, ncols);
  });
}

using Bf16DpFn = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, const float*, float*, int64_t, int64_t);
using WidenFn = void (*)(const float*, int64_t, int64_t, const uint16_t*, const float*, float*, int64_t, int64_t);
using F32Fn = void (*)(const float*, int64_t, int64_t, const float*, const float*, float*, int64_t, int64_t);

constexpr Bf16DpFn kBf16Dp[] = {nullptr, bf16_dp_kernel<1>, bf16_dp_kernel<2>, bf16_dp_kernel<3>, bf16_dp_kernel<4>,
                                bf16_dp_kernel<5>, bf16_dp_kernel<6>, bf16_dp_kernel<7>, bf16_dp_kernel<8>,
                                bf16_dp_kernel<9>, bf16_dp_kernel<10>, bf16_dp_kernel<11>, bf16_dp_kernel<12>};
template <int MR, int S = sets_for(MR)>
constexpr Bf16DpFn kBf16DpAccOf = bf16_dp_kernel<MR, S, true>;
constexpr Bf16DpFn kBf16DpAcc[] = {nullptr, kBf16DpAccOf<1>, kBf16DpAccOf<2>, kBf16DpAccOf<3>, kBf16DpAccOf<4>,
                                   kBf16DpAccOf<5>, kBf16DpAccOf<6>, kBf16DpAccOf<7>, kBf16DpAccOf<8>,
                                   kBf16DpAccOf<9>, kBf16DpAccOf<10>, kBf16DpAccOf<11>, kBf16DpAccOf<12>};
using SwigluFn = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, const uint16_t*, uint16_t*, int64_t,
                          int64_t);
constexpr SwigluFn kSwiglu[] = {nullptr, bf16_swiglu_kernel<1>, bf16_swiglu_kernel<2>, bf16_swiglu_kernel<3>,
                                bf16_swiglu_kernel<4>, bf16_swiglu_kernel<5>, bf16_swiglu_kernel<6>};
using ArgmaxFn = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, const uint16_t*, int64_t, int64_t,
                          float*, int32_t*);
constexpr ArgmaxFn kArgmax[] = {nullptr, bf16_argmax_kernel<1>, bf16_argmax_kernel<2>, bf16_argmax_kernel<3>,
                                bf16_argmax_kernel<4>, bf16_argmax_kernel<5>, bf16_argmax_kernel<6>};
using Dp2Fn = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, const uint16_t*, const float*, float*,
                       int64_t, int64_t);
constexpr Dp2Fn kDp2[] = {nullptr, bf16_dp2_kernel<1>, bf16_dp2_kernel<2>, bf16_dp2_kernel<3>,
                          bf16_dp2_kernel<4>, bf16_dp2_kernel<5>, bf16_dp2_kernel<6>};
constexpr WidenFn kWiden[] = {nullptr, bf16_widen_kernel<1>, bf16_widen_kernel<2>, bf16_widen_kernel<3>,
                              bf16_widen_kernel<4>, bf16_widen_kernel<5>, bf16_widen_kernel<6>,
                              bf16_widen_kernel<7>, bf16_widen_kernel<8>};
template <bool ACC>
constexpr F32Fn kF32[] = {nullptr, f32_kernel<1, ACC>, f32_kernel<2, ACC>, f32_kernel<3, ACC>, f32_kernel<4, ACC>,
                          f32_kernel<5, ACC>, f32_kernel<6, ACC>, f32_kernel<7, ACC>, f32_kernel<8, ACC>,
                          f32_kernel<9, ACC>, f32_kernel<10, ACC>, f32_kernel<11, ACC>, f32_kernel<12, ACC>,
                          f32_kernel<13, ACC>, f32_kernel<14, ACC>};
// Batch-invariant mode: one accumulator set for every row count (the tuned kernels' choice from 5
// rows on), so a row's sum runs in the same order in any block; fewer rows lose some latency
// hiding, which a memory-bound decode step does not feel.
constexpr Bf16DpFn kBf16DpInvariant[] = {
    nullptr, bf16_dp_kernel<1, 1>, bf16_dp_kernel<2, 1>, bf16_dp_kernel<3, 1>, bf16_dp_kernel<4, 1>,
    bf16_dp_kernel<5>, bf16_dp_kernel<6>, bf16_dp_kernel<7>, bf16_dp_kernel<8>, bf16_dp_kernel<9>,
    bf16_dp_kernel<10>, bf16_dp_kernel<11>, bf16_dp_kernel<12>};
constexpr Bf16DpFn kBf16DpAccInvariant[] = {
    nullptr, kBf16DpAccOf<1, 1>, kBf16DpAccOf<2, 1>, kBf16DpAccOf<3, 1>, kBf16DpAccOf<4, 1>, kBf16DpAccOf<5>,
    kBf16DpAccOf<6>, kBf16DpAccOf<7>, kBf16DpAccOf<8>, kBf16DpAccOf<9>, kBf16DpAccOf<10>, kBf16DpAccOf<11>,
    kBf16DpAccOf<12>};
template <bool ACC>
constexpr F32Fn kF32Invariant[] = {nullptr, f32_kernel<1, ACC, 1>, f32_kernel<2, ACC, 1>, f32_kernel<3, ACC, 1>,
                                   f32_kernel<4, ACC, 1>, f32_kernel<5, ACC>, f32_kernel<6, ACC>, f32_kernel<7, ACC>,
                                   f32_kernel<8, ACC>, f32_kernel<9, ACC>, f32_kernel<10, ACC>, f32_kernel<11, ACC>,
                                   f32_kernel<12, ACC>, f32_kernel<13, ACC>, f32_kernel<14, ACC>};

}  // namespace tm_avx512_detail

namespace tm_avx512_bf16 {
using namespace tm_avx512_detail;
void bf16_panel_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel,
                     const float* bias, float* y, int64_t ldy, int64_t ncols) {
  if (tokenmill_isa::batch_invariant())
    row_blocks<12>(x, lda, M, K, panel, bias, y, ldy, ncols, kBf16DpInvariant);
  else
    row_blocks<12>(x, lda, M, K, panel, bias, y, ldy, ncols, kBf16Dp);
}
void bf16_panel_rows_acc(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel, float* y,
                         int64_t ldy, int64_t ncols) {
  const float* none = nullptr;
  if (tokenmill_isa::batch_invariant())
    row_blocks<12>(x, lda, M, K, panel, none, y, ldy, ncols, kBf16DpAccInvariant);
  else
    row_blocks<12>(x, lda, M, K, panel, none, y, ldy, ncols, kBf16DpAcc);
}
void bf16_panel_pair_argmax_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel0,
                                 const uint16_t* panel1, int64_t n0, int64_t n_valid, float* best_v,
                                 int32_t* best_i) {
  for_row_blocks<6>(M, [&](int64_t r0, int64_t rows) {
    kArgmax[rows](x + r0 * lda, lda, K, panel0, panel1, n0, n_valid, best_v + 16 * r0, best_i + 16 * r0);
  });
}
void bf16_panel_pair_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel0,
                          const uint16_t* panel1, const float* bias, float* y, int64_t ldy, int64_t ncols) {
  for_row_blocks<6>(M, [&](int64_t r0, int64_t rows) {
    kDp2[rows](x + r0 * lda, lda, K, panel0, panel1, bias, y + r0 * ldy, ldy, ncols);
  });
}
void bf16_swiglu_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* gate_panel,
                      const uint16_t* up_panel, uint16_t* y, int64_t ldy, int64_t ncols) {
  for_row_blocks<6>(M, [&](int64_t r0, int64_t rows) {
    kSwiglu[rows](x + r0 * lda, lda, K, gate_panel, up_panel, y + r0 * ldy, ldy, ncols);
  });
}
void round_to_bf16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i))));
  if (i < n) {
    const __mmask16 m = cols_mask(n - i);
    const __m256bh r = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm256_mask_storeu_epi16(y + i, m, reinterpret_cast<const __m256i&>(r));
  }
}
}  // namespace tm_avx512_bf16

namespace tm_avx512 {
using namespace tm_avx512_detail;
void bf16_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel, const float* bias,
                     float* y, int64_t ldy, int64_t ncols) {
  row_blocks<8>(x, lda, M, K, panel, bias, y, ldy, ncols, kWiden);
}
void f32_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const float* panel, const float* bias,
                    float* y, int64_t ldy, int64_t ncols) {
  if (tokenmill_isa::batch_invariant())
    row_blocks<14>(x, lda, M, K, panel, bias, y, ldy, ncols, kF32Invariant<false>);
  else
    row_blocks<14>(x, lda, M, K, panel, bias, y, ldy, ncols, kF32<false>);
}
void f32_panel_rows_acc(const float* x, int64_t lda, int64_t M, int64_t K, const float* panel, float* y,
                        int64_t ldy, int64_t ncols) {
  if (tokenmill_isa::batch_invariant())
    row_blocks<14>(x, lda, M, K, panel, static_cast<const float*>(nullptr), y, ldy, ncols, kF32Invariant<true>);
  else
    row_blocks<14>(x, lda, M, K, panel, static_cast<const float*>(nullptr), y, ldy, ncols, kF32<true>);
}
}  // namespace tm_avx512

TM_AVX512_END

#else  // not x86-64: the level never reaches AVX-512 (cpu_isa.cpp), so these are never called
namespace tm_avx512_bf16 {
void bf16_panel_rows(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, const float*, float*, int64_t,
                     int64_t) { std::abort(); }
void bf16_panel_rows_acc(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, float*, int64_t, int64_t) {
  std::abort();
}
void round_to_bf16(const float*, uint16_t*, int64_t) { std::abort(); }
void bf16_swiglu_rows(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, uint16_t*,
                      int64_t, int64_t) {
  std::abort();
}
void bf16_panel_pair_rows(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*,
                          const float*, float*, int64_t, int64_t) {
  std::abort();
}
void bf16_panel_pair_argmax_rows(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*,
                                 int64_t, int64_t, float*, int32_t*) {
  std::abort();
}
}  // namespace tm_avx512_bf16
namespace tm_avx512 {
void bf16_panel_rows(const float*, int64_t, int64_t, int64_t, const uint16_t*, const float*, float*, int64_t,
                     int64_t) { std::abort(); }
void f32_panel_rows(const float*, int64_t, int64_t, int64_t, const float*, const float*, float*, int64_t,
                    int64_t) { std::abort(); }
void f32_panel_rows_acc(const float*, int64_t, int64_t, int64_t, const float*, float*, int64_t, int64_t) {
  std::abort();
}
}  // namespace tm_avx512
#endif
