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

}  // namespace tm_avx512_detail
