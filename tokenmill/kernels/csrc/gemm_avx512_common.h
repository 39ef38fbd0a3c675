// Helpers of the AVX-512 GEMM units (gemm_avx512.cpp, gemm_pair_avx512.cpp). Include only inside an
// AVX-512 unit's target region (after TM_AVX512_BEGIN): they use AVX-512 intrinsics.
// The including unit brings <algorithm>, <cstdint>, <cstring> and gemm_isa.h in before its pragma
// (standard headers' inline functions must keep the baseline ISA).
#pragma once

namespace tm_avx512_detail {

using tokenmill_gemm::kBf16PanelPairStride;

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

// y row (32 columns at most) = [lo | hi] + bias: a 32-column block's two accumulators
template <bool ACC = false>
inline void store32(float* y, const float* bias, __m512 lo, __m512 hi, int64_t ncols) {
  store16<ACC>(y, bias, lo, ncols);
  store16<ACC>(y + 16, bias ? bias + 16 : nullptr, hi, ncols - 16);
}

inline __m512i bcast_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

inline __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
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

// bf16 weights widened to float32 in registers (AVX-512F without BF16): lane j of a pair row holds
// (w[k][j], w[k+1][j]); shifting left by 16 gives w[k] and masking the low half gives w[k+1]. From
// float32 x, an MR x 32 block of two 16-column groups a and b (each a pointer into a 32-column
// panel's pair rows, whose second group is at +32), MR <= 12 (24 accumulators + 4 widened vectors + a
// broadcast): per k pair 2 loads and 4 widening ops feed 4 MR FMAs, the even k, then the odd k, into
// one accumulator. bf16_widen_kernel takes one panel's two groups; SwiGLU (gemm_pair_avx512.cpp) a
// gate and an up group. acc[r][0] = group a, acc[r][1] = group b.
template <int MR>
__attribute__((always_inline)) inline void widen_groups_accumulate(const float* x, int64_t lda, int64_t K,
                                                                   const uint16_t* a, const uint16_t* b,
                                                                   __m512 (&acc)[MR][2]) {
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const __m512i hi = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const int64_t pairs = (K + 1) / 2;
  for (int64_t kk = 0; kk < pairs; ++kk) {
    const uint16_t* pa = a + kk * kBf16PanelPairStride;
    const uint16_t* pb = b + kk * kBf16PanelPairStride;
    _mm_prefetch(reinterpret_cast<const char*>(pa) + 1024, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(pb) + 1024, _MM_HINT_T0);
    const __m512i va = _mm512_loadu_si512(pa), vb = _mm512_loadu_si512(pb);
    const __m512 ea = _mm512_castsi512_ps(_mm512_slli_epi32(va, 16)), oa = _mm512_castsi512_ps(_mm512_and_si512(va, hi));
    const __m512 eb = _mm512_castsi512_ps(_mm512_slli_epi32(vb, 16)), ob = _mm512_castsi512_ps(_mm512_and_si512(vb, hi));
    const bool odd = 2 * kk + 1 < K;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 x0 = _mm512_set1_ps(x[r * lda + 2 * kk]);
      acc[r][0] = _mm512_fmadd_ps(x0, ea, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x0, eb, acc[r][1]);
      if (odd) {
        const __m512 x1 = _mm512_set1_ps(x[r * lda + 2 * kk + 1]);
        acc[r][0] = _mm512_fmadd_ps(x1, oa, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(x1, ob, acc[r][1]);
      }
    }
  }
}

}  // namespace tm_avx512_detail
