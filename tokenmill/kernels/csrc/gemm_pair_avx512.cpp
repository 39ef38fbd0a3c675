// GEMM kernels that take two 32-column bf16 panels per pass over x (gemm_isa.h): the linear layers'
// dot-product path (AVX512_BF16), and SwiGLU fused into the gate/up GEMM and greedy sampling's LM head
// argmax, each from bf16 x through vdpbf16ps (AVX512_BF16) or from float32 x with the weights widened
// in registers (AVX-512F). Compiled for AVX-512 by the target pragma below whatever the build's
// baseline, and only called when the running CPU has the instructions (bf16_gemm.cpp). Standard
// headers come before it.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "gemm_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx512_intrinsics.h"

TM_AVX512_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include "exp512.h"
#include "gemm_avx512_common.h"

namespace tm_avx512_detail {

// Two panels at once through vdpbf16ps: an MR x 64 block (p0's 32 columns, then p1's) in 4
// accumulators per row, MR <= 6 (24 of the 32 zmm). Each broadcast of x feeds four dot products
// instead of two: 10 loads per 24 vdpbf16ps against 14 for bf16_dp_kernel's 12 x 32 block (our 2048^3
// bf16 GEMM: 268 -> 391-403 GFLOP/s on Zen 4, docs/BENCHMARKS.md session 23). acc[r][0..3] = columns 0-15,
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

// The same MR x 64 block from float32 x, the bf16 weights widened to float32 in registers (AVX-512F
// without BF16: shifting a pair lane left by 16 gives w[k], masking its low half w[k+1]). Per k pair
// the even k, then the odd k, into one accumulator set: bf16_widen_kernel's order, so every column's
// sum is the one bf16_panel_rows gives at this level. The weights are loaded twice (once per half) so
// that 24 accumulators, 4 weight vectors and a broadcast fit the 32 zmm.
template <int MR>
__attribute__((always_inline)) inline void widen2_accumulate(const float* x, int64_t lda, int64_t K,
                                                             const uint16_t* p0, const uint16_t* p1,
                                                             __m512 (&acc)[MR][4], const char* ahead = nullptr,
                                                             int64_t ahead_lines = 0) {
  // ahead[0 : 64 ahead_lines]: bytes to bring into L2 on the way, a line per k pair (argmax_rows)
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  const __m512i hi = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const int64_t pairs = (K + 1) / 2;
  for (int64_t kk = 0; kk < pairs; ++kk) {
    const uint16_t* src[4] = {p0 + kk * kBf16PanelPairStride, p0 + kk * kBf16PanelPairStride + 32,
                              p1 + kk * kBf16PanelPairStride, p1 + kk * kBf16PanelPairStride + 32};
#pragma GCC unroll 4
    for (int j = 0; j < 4; j += 2) _mm_prefetch(reinterpret_cast<const char*>(src[j]) + 1024, _MM_HINT_T0);
    if (kk < ahead_lines) _mm_prefetch(ahead + 64 * kk, _MM_HINT_T1);
    __m512 w[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) w[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(src[j]), 16));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * lda + 2 * kk]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(a, w[j], acc[r][j]);
    }
    if (2 * kk + 1 < K) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) w[j] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(src[j]), hi));
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512 a = _mm512_set1_ps(x[r * lda + 2 * kk + 1]);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(a, w[j], acc[r][j]);
      }
    }
  }
}

// x in bf16 bits: the dot-product block; float32 x: the widened one
template <int MR, typename X>
__attribute__((always_inline)) inline void accumulate2(const X* x, int64_t lda, int64_t K, const uint16_t* p0,
                                                       const uint16_t* p1, __m512 (&acc)[MR][4]) {
  if constexpr (std::is_same_v<X, float>)
    widen2_accumulate<MR>(x, lda, K, p0, p1, acc);
  else
    dp2_accumulate<MR, dp2_sets(MR)>(x, lda, K, p0, p1, acc);
}

// y[MR, ncols <= 64] = x . [p0 | p1] (+ bias)
template <int MR>
void bf16_dp2_kernel(const uint16_t* x, int64_t lda, int64_t K, const uint16_t* p0, const uint16_t* p1,
                     const float* bias, float* y, int64_t ldy, int64_t ncols) {
  __m512 acc[MR][4];
  dp2_accumulate<MR, dp2_sets(MR)>(x, lda, K, p0, p1, acc);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j)
      store16(y + r * ldy + 16 * j, bias ? bias + 16 * j : nullptr, acc[r][j], ncols - 16 * j);
}

// SwiGLU: y[MR, ncols <= 32] = silu(x . pg) * (x . pu); silu as silu_and_mul computes it (g / (1 +
// exp(-g)), the same exp polynomial). From bf16 x, y in bf16 (for the down projection's dot-product
// path, which rounds its input to bf16 anyway); from float32 x, float32 y (the widening path's input).
// silu(g) * u, lane by lane
inline __m512 silu_times(__m512 g, __m512 u) {
  const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.f), tm_avx512_math::exp512(_mm512_sub_ps(_mm512_setzero_ps(), g)));
  return _mm512_mul_ps(_mm512_div_ps(g, den), u);
}

template <int MR, typename X, typename Y>
void swiglu_kernel(const X* x, int64_t lda, int64_t K, const uint16_t* pg, const uint16_t* pu, Y* y, int64_t ldy,
                   int64_t ncols) {
  __m512 acc[MR][4];
  accumulate2<MR>(x, lda, K, pg, pu, acc);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 2; ++j) {
      const __m512 out = silu_times(acc[r][j], acc[r][j + 2]);
      const __mmask16 m = cols_mask(ncols - 16 * j);
      if constexpr (std::is_same_v<Y, float>) {
        _mm512_mask_storeu_ps(y + r * ldy + 16 * j, m, out);
      } else {
        const __m256bh h = _mm512_cvtneps_pbh(out);
        if (m) _mm256_mask_storeu_epi16(y + r * ldy + 16 * j, m, reinterpret_cast<const __m256i&>(h));
      }
    }
}

// From float32 x in 12-row blocks: the gate's and the up projection's 16-column group j together,
// j = 0, 1 (swiglu_kernel's values: the same sums, the same epilogue).
template <int MR>
void swiglu_groups_kernel(const float* x, int64_t lda, int64_t K, const uint16_t* pg, const uint16_t* pu, float* y,
                          int64_t ldy, int64_t ncols) {
  for (int j = 0; j < 2 && 16 * j < ncols; ++j) {
    __m512 acc[MR][2];
    widen_groups_accumulate<MR>(x, lda, K, pg + 32 * j, pu + 32 * j, acc);
    const __mmask16 m = cols_mask(ncols - 16 * j);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + r * ldy + 16 * j, m, silu_times(acc[r][0], acc[r][1]));
  }
}

// Greedy sampling's LM head: an MR x 64 block of logits (bf16_dp2_kernel's arithmetic, so the same
// values) folded into each row's running best per lane: best_v/best_i [MR][16], lane l having seen
// columns = l (mod 16) in increasing order; a strictly greater value replaces, so each lane keeps the
// first column of its maximum. Columns at or past n_valid are skipped.
template <int MR, typename X>
void argmax_kernel(const X* x, int64_t lda, int64_t K, const uint16_t* p0, const uint16_t* p1, int64_t n0,
                   int64_t n_valid, float* best_v, int32_t* best_i, const char* ahead, int64_t ahead_lines) {
  __m512 acc[MR][4];
  if constexpr (std::is_same_v<X, float>)
    widen2_accumulate<MR>(x, lda, K, p0, p1, acc, ahead, ahead_lines);
  else
    accumulate2<MR>(x, lda, K, p0, p1, acc);
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

template <typename X, typename Y>
using SwigluFn = void (*)(const X*, int64_t, int64_t, const uint16_t*, const uint16_t*, Y*, int64_t, int64_t);
template <typename X, typename Y>
constexpr SwigluFn<X, Y> kSwiglu[] = {nullptr, swiglu_kernel<1, X, Y>, swiglu_kernel<2, X, Y>, swiglu_kernel<3, X, Y>,
                                      swiglu_kernel<4, X, Y>, swiglu_kernel<5, X, Y>, swiglu_kernel<6, X, Y>};
template <typename X>
using ArgmaxFn = void (*)(const X*, int64_t, int64_t, const uint16_t*, const uint16_t*, int64_t, int64_t, float*,
                          int32_t*, const char*, int64_t);
template <typename X>
constexpr ArgmaxFn<X> kArgmax[] = {nullptr, argmax_kernel<1, X>, argmax_kernel<2, X>, argmax_kernel<3, X>,
                                   argmax_kernel<4, X>, argmax_kernel<5, X>, argmax_kernel<6, X>};

template <typename X>
void argmax_rows(const X* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel0, const uint16_t* panel1,
                 int64_t n0, int64_t n_valid, float* best_v, int32_t* best_i) {
  // Widening: the LM head's weights (56 MB for the default model) come from DRAM, and the first row
  // block of a pair waited on them. The next pair (contiguous after this one: the thread's next unit;
  // past the tensor's end after its last, which prefetch ignores) goes into L2 meanwhile, a line per
  // k pair of this pair's first row blocks (all of it from 4 blocks, 19 rows, on). The head alone on
  // machine D: 1.06-1.12x at 16 rows, unchanged at 52-512 (docs/BENCHMARKS.md, session 30).
  const int64_t pairs = (K + 1) / 2, lines = 4 * pairs;
  const char* next = reinterpret_cast<const char*>(panel1 + pairs * kBf16PanelPairStride);
  int64_t done = 0;
  for_row_blocks<6>(M, [&](int64_t r0, int64_t rows) {
    const int64_t n = std::is_same_v<X, float> ? std::min(pairs, lines - done) : 0;
    kArgmax<X>[rows](x + r0 * lda, lda, K, panel0, panel1, n0, n_valid, best_v + 16 * r0, best_i + 16 * r0,
                     next + 64 * done, n);
    done += n;
  });
}
using SwigluGroupsFn = void (*)(const float*, int64_t, int64_t, const uint16_t*, const uint16_t*, float*, int64_t,
                                int64_t);
constexpr SwigluGroupsFn kSwigluGroups[] = {
    nullptr, swiglu_groups_kernel<1>, swiglu_groups_kernel<2>, swiglu_groups_kernel<3>, swiglu_groups_kernel<4>,
    swiglu_groups_kernel<5>, swiglu_groups_kernel<6>, swiglu_groups_kernel<7>, swiglu_groups_kernel<8>,
    swiglu_groups_kernel<9>, swiglu_groups_kernel<10>, swiglu_groups_kernel<11>, swiglu_groups_kernel<12>};

// From float32 x, 7 rows or more go through the 12-row group kernel (W1 1.03x on machine D, session 30);
// fewer, where it would wait on its FMAs' latency, through the 6 x 64 one.
template <typename X, typename Y>
void swiglu_rows(const X* x, int64_t lda, int64_t M, int64_t K, const uint16_t* gate_panel, const uint16_t* up_panel,
                 Y* y, int64_t ldy, int64_t ncols) {
  if constexpr (std::is_same_v<X, float>) {
    if (M > 6) {
      for_row_blocks<12>(M, [&](int64_t r0, int64_t rows) {
        kSwigluGroups[rows](x + r0 * lda, lda, K, gate_panel, up_panel, y + r0 * ldy, ldy, ncols);
      });
      return;
    }
  }
  for_row_blocks<6>(M, [&](int64_t r0, int64_t rows) {
    kSwiglu<X, Y>[rows](x + r0 * lda, lda, K, gate_panel, up_panel, y + r0 * ldy, ldy, ncols);
  });
}
using Dp2Fn = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, const uint16_t*, const float*, float*,
                       int64_t, int64_t);
constexpr Dp2Fn kDp2[] = {nullptr, bf16_dp2_kernel<1>, bf16_dp2_kernel<2>, bf16_dp2_kernel<3>,
                          bf16_dp2_kernel<4>, bf16_dp2_kernel<5>, bf16_dp2_kernel<6>};

}  // namespace tm_avx512_detail

namespace tm_avx512_bf16 {
using namespace tm_avx512_detail;
void bf16_panel_pair_argmax_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel0,
                                 const uint16_t* panel1, int64_t n0, int64_t n_valid, float* best_v,
                                 int32_t* best_i) {
  argmax_rows(x, lda, M, K, panel0, panel1, n0, n_valid, best_v, best_i);
}
void bf16_panel_pair_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel0,
                          const uint16_t* panel1, const float* bias, float* y, int64_t ldy, int64_t ncols) {
  for_row_blocks<6>(M, [&](int64_t r0, int64_t rows) {
    kDp2[rows](x + r0 * lda, lda, K, panel0, panel1, bias, y + r0 * ldy, ldy, ncols);
  });
}
void bf16_swiglu_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* gate_panel,
                      const uint16_t* up_panel, uint16_t* y, int64_t ldy, int64_t ncols) {
  swiglu_rows(x, lda, M, K, gate_panel, up_panel, y, ldy, ncols);
}
}  // namespace tm_avx512_bf16

namespace tm_avx512 {
using namespace tm_avx512_detail;
void bf16_panel_pair_argmax_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel0,
                                 const uint16_t* panel1, int64_t n0, int64_t n_valid, float* best_v,
                                 int32_t* best_i) {
  argmax_rows(x, lda, M, K, panel0, panel1, n0, n_valid, best_v, best_i);
}
void bf16_swiglu_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* gate_panel,
                      const uint16_t* up_panel, float* y, int64_t ldy, int64_t ncols) {
  swiglu_rows(x, lda, M, K, gate_panel, up_panel, y, ldy, ncols);
}
}  // namespace tm_avx512

TM_AVX512_END

#else  // not x86-64: the level never reaches AVX-512 (cpu_isa.cpp), so these are never called
namespace tm_avx512_bf16 {
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
void bf16_panel_pair_argmax_rows(const float*, int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, int64_t,
                                 int64_t, float*, int32_t*) {
  std::abort();
}
void bf16_swiglu_rows(const float*, int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, float*, int64_t,
                      int64_t) {
  std::abort();
}
}  // namespace tm_avx512
#endif
