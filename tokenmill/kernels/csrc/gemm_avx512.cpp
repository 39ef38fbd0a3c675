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
#include "gemm_avx512_common.h"

// Named (not anonymous) so that tests/test_cpu_isa.py can check in the built library that AVX-512
// instructions appear only in functions of the tm_avx512* namespaces.
namespace tm_avx512_detail {

constexpr int sets_for(int mr) { return mr <= 2 ? 4 : (mr <= 4 ? 2 : 1); }

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
    store32<ACC>(y + r * ldy, bias, c0[0][r], c1[0][r], ncols);
  }
}

// One panel's 32 columns from float32 x, the weights widened (widen_groups_accumulate), up to 12 rows:
// the 4 widening ops of a k pair are shared by more FMAs than at 8 (W1 1.01-1.02x on machine D,
// docs/BENCHMARKS.md session 29).
template <int MR>
void bf16_widen_kernel(const float* x, int64_t lda, int64_t K, const uint16_t* p, const float* bias, float* y,
                       int64_t ldy, int64_t ncols) {
  __m512 acc[MR][2];
  widen_groups_accumulate<MR>(x, lda, K, p, p + 32, acc);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) store32(y + r * ldy, bias, acc[r][0], acc[r][1], ncols);
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

// float32 panels two at a time: an MR x 32 block (p0's 16 columns, then p1's) in two accumulators per
// row, MR <= 12 (24 zmm), one set over k in order. Each broadcast of x feeds two FMAs instead of one:
// with two 512-bit FMA ports the single-panel kernel issues a broadcast load per FMA and waits on the
// load ports (docs/BENCHMARKS.md, session 29). ACC: y += the block (prefill attention's O += P V).
template <int MR, bool ACC = false>
void f32_pair_kernel(const float* x, int64_t lda, int64_t K, const float* p0, const float* p1, const float* bias,
                     float* y, int64_t ldy, int64_t ncols) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(p0 + k * 16) + 1024, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p1 + k * 16) + 1024, _MM_HINT_T0);
    const __m512 b0 = _mm512_loadu_ps(p0 + k * 16), b1 = _mm512_loadu_ps(p1 + k * 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * lda + k]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) store32<ACC>(y + r * ldy, bias, c0[r], c1[r], ncols);
}

using F32PairFn = void (*)(const float*, int64_t, int64_t, const float*, const float*, const float*, float*, int64_t,
                           int64_t);
template <bool ACC>
constexpr F32PairFn kF32Pair[] = {nullptr,
                                  f32_pair_kernel<1, ACC>,  f32_pair_kernel<2, ACC>,  f32_pair_kernel<3, ACC>,
                                  f32_pair_kernel<4, ACC>,  f32_pair_kernel<5, ACC>,  f32_pair_kernel<6, ACC>,
                                  f32_pair_kernel<7, ACC>,  f32_pair_kernel<8, ACC>,  f32_pair_kernel<9, ACC>,
                                  f32_pair_kernel<10, ACC>, f32_pair_kernel<11, ACC>, f32_pair_kernel<12, ACC>};

// M rows in blocks of at most MAX rows (for_row_blocks), each block through KERNEL<rows>.
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
constexpr WidenFn kWiden[] = {nullptr, bf16_widen_kernel<1>, bf16_widen_kernel<2>, bf16_widen_kernel<3>,
                              bf16_widen_kernel<4>, bf16_widen_kernel<5>, bf16_widen_kernel<6>,
                              bf16_widen_kernel<7>, bf16_widen_kernel<8>, bf16_widen_kernel<9>,
                              bf16_widen_kernel<10>, bf16_widen_kernel<11>, bf16_widen_kernel<12>};
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

// 2^x for x <= 8 (scores minus their running max, in log2 units): 2^round(x) * q(f), f = x - round(x) in
// [-0.5, 0.5], q a degree-4 fit of 2^f (max relative error 5.7e-6: the numerators are rounded to bf16, 2^-9,
// right after). vscalefps scales by 2^round(x) and flushes x far below the float range to 0, so no clamp.
inline __m512 exp2_fast(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(0.009590240195393562f), f, _mm512_set1_ps(0.05587027221918106f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.2402367740869522f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.6931280493736267f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(q, n);
}

float exp2_round_row(const float* s, int64_t n, int64_t width, float mx, uint16_t* p) {
  const __m512 m = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 k = cols_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, exp2_fast(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), m)));
    sum = _mm512_add_ps(sum, e);
    const __m256bh r = _mm512_cvtneps_pbh(e);
    _mm256_mask_storeu_epi16(p + i, cols_mask(width - i), reinterpret_cast<const __m256i&>(r));
  }
  return _mm512_reduce_add_ps(sum);
}
}  // namespace tm_avx512_bf16

namespace tm_avx512 {
using namespace tm_avx512_detail;
void bf16_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel, const float* bias,
                     float* y, int64_t ldy, int64_t ncols) {
  row_blocks<12>(x, lda, M, K, panel, bias, y, ldy, ncols, kWiden);
}
void f32_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const float* panel, const float* bias,
                    float* y, int64_t ldy, int64_t ncols) {
  if (tokenmill_isa::batch_invariant())
    row_blocks<14>(x, lda, M, K, panel, bias, y, ldy, ncols, kF32Invariant<false>);
  else
    row_blocks<14>(x, lda, M, K, panel, bias, y, ldy, ncols, kF32<false>);
}
void f32_panel_pair_rows(const float* x, int64_t lda, int64_t M, int64_t K, const float* panel0,
                         const float* panel1, const float* bias, float* y, int64_t ldy, int64_t ncols) {
  for_row_blocks<12>(M, [&](int64_t r0, int64_t rows) {
    kF32Pair<false>[rows](x + r0 * lda, lda, K, panel0, panel1, bias, y + r0 * ldy, ldy, ncols);
  });
}
void f32_panels_rows(const float* x, int64_t lda, int64_t M, int64_t K, const float* panel, int64_t pstride,
                     float* y, int64_t ldy, int64_t ncols, bool acc) {
  const int64_t npanels = (ncols + 15) / 16;
  const F32PairFn* pair = acc ? kF32Pair<true> : kF32Pair<false>;
  const F32Fn* single = acc ? kF32Invariant<true> : kF32Invariant<false>;
  for_row_blocks<12>(M, [&](int64_t r0, int64_t rows) {
    const float* xr = x + r0 * lda;
    float* yr = y + r0 * ldy;
    int64_t j = 0;
    for (; j + 1 < npanels; j += 2)
      pair[rows](xr, lda, K, panel + j * pstride, panel + (j + 1) * pstride, nullptr, yr + j * 16, ldy,
                 ncols - j * 16);
    if (j < npanels) single[rows](xr, lda, K, panel + j * pstride, nullptr, yr + j * 16, ldy, ncols - j * 16);
  });
}
float exp2_sub_row(float* s, int64_t n, int64_t width, float mx) {
  const __m512 m = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 k = cols_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, tm_avx512_math::exp2_512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), m)));
    sum = _mm512_add_ps(sum, e);
    _mm512_mask_storeu_ps(s + i, cols_mask(width - i), e);
  }
  return _mm512_reduce_add_ps(sum);
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
float exp2_round_row(const float*, int64_t, int64_t, float, uint16_t*) { std::abort(); }
}  // namespace tm_avx512_bf16
namespace tm_avx512 {
void bf16_panel_rows(const float*, int64_t, int64_t, int64_t, const uint16_t*, const float*, float*, int64_t,
                     int64_t) { std::abort(); }
void f32_panel_rows(const float*, int64_t, int64_t, int64_t, const float*, const float*, float*, int64_t,
                    int64_t) { std::abort(); }
void f32_panel_pair_rows(const float*, int64_t, int64_t, int64_t, const float*, const float*, const float*, float*,
                         int64_t, int64_t) {
  std::abort();
}
void f32_panels_rows(const float*, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t, bool) {
  std::abort();
}
float exp2_sub_row(float*, int64_t, int64_t, float) { std::abort(); }
}  // namespace tm_avx512
#endif
