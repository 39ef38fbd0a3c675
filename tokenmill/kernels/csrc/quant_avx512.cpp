// AVX-512 VNNI row kernels for block-quantized weights (quant_isa.h): one vpdpbusd multiplies 16
// output rows x 4 k of codes with 4 broadcast activation bytes and sums into 16 int32 lanes.
// Compiled for AVX-512 by the target pragma whatever the baseline, and called only where the CPU has
// AVX512_VNNI (quant_gemm.cpp); standard headers come before the pragma (see gemm_avx512.cpp).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "quant_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx512_intrinsics.h"

TM_AVX512_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

namespace tm_avx512_vnni {
namespace {

using tokenmill_quant::kBlockK;
using tokenmill_quant::kQ4Record;
using tokenmill_quant::kQ8Record;
using tokenmill_quant::QActs;

inline __m512i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline void store_rows(float* y, const float* bias, __m512 acc, int64_t ncols) {
  const __mmask16 mask = ncols >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << ncols) - 1);
  if (bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, bias));
  _mm512_mask_storeu_ps(y, mask, acc);
}

// Independent int32 accumulators per row (4 for one row, 2 for two or more) hide vpdpbusd's latency.
// Prefetch: this pass is the first over the group's records (rows from 0), which stream from DRAM.
template <int MR, bool Prefetch>
void q4_kernel(const uint8_t* rec, const QActs& a, int64_t row0, const float* bias, float* y, int64_t ldy,
               int64_t ncols) {
  constexpr int S = MR == 1 ? 4 : 2;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* R = rec + b * kQ4Record;
    if constexpr (Prefetch) tokenmill_quant::prefetch_record_ahead<kQ4Record>(R);
    __m512i lo[4], hi[4];
    for (int j = 0; j < 4; ++j) {
      const __m512i w = _mm512_loadu_si512(R + j * 64);
      lo[j] = _mm512_and_si512(w, low);
      hi[j] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(R + 256)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(R + 288)));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const int64_t row = row0 + i;
      const int8_t* xb = a.qx + row * a.K + b * kBlockK;
      __m512i s[S];
      for (int t = 0; t < S; ++t) s[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        s[(2 * j) % S] = _mm512_dpbusd_epi32(s[(2 * j) % S], lo[j], bcast4(xb + 4 * j));
        s[(2 * j + 1) % S] = _mm512_dpbusd_epi32(s[(2 * j + 1) % S], hi[j], bcast4(xb + 16 + 4 * j));
      }
      __m512i total = s[0];
      for (int t = 1; t < S; ++t) total = _mm512_add_epi32(total, s[t]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, _mm512_set1_ps(a.dx[row * a.nb + b])), acc[i]);
      acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.sx[row * a.nb + b]), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) store_rows(y + i * ldy, bias, acc[i], ncols);
}

// signed codes x signed activations: vpdpbusd takes (x + 128) as the unsigned operand, and the block's
// 128 * sum(w) is taken back out in float (s = d * sum(codes) is stored per row and block)
template <int MR, bool Prefetch>
void q8_kernel(const uint8_t* rec, const QActs& a, int64_t row0, const float* bias, float* y, int64_t ldy,
               int64_t ncols) {
  constexpr int S = MR == 1 ? 4 : 2;
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* R = rec + b * kQ8Record;
    if constexpr (Prefetch) tokenmill_quant::prefetch_record_ahead<kQ8Record>(R);
    __m512i w[8];
    for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(R + j * 64);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(R + 512)));
    const __m512 sw = _mm512_loadu_ps(reinterpret_cast<const float*>(R + 544));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const int64_t row = row0 + i;
      const uint8_t* xb = a.qxu + row * a.K + b * kBlockK;
      __m512i s[S];
      for (int t = 0; t < S; ++t) s[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) s[j % S] = _mm512_dpbusd_epi32(s[j % S], bcast4(xb + 4 * j), w[j]);
      __m512i total = s[0];
      for (int t = 1; t < S; ++t) total = _mm512_add_epi32(total, s[t]);
      const float dx = a.dx[row * a.nb + b];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[i]);
      acc[i] = _mm512_fnmadd_ps(sw, _mm512_set1_ps(128.f * dx), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) store_rows(y + i * ldy, bias, acc[i], ncols);
}

using Kernel = void (*)(const uint8_t*, const QActs&, int64_t, const float*, float*, int64_t, int64_t);
constexpr Kernel kQ4[2][5] = {{nullptr, q4_kernel<1, false>, q4_kernel<2, false>, q4_kernel<3, false>, q4_kernel<4, false>},
                               {nullptr, q4_kernel<1, true>, q4_kernel<2, true>, q4_kernel<3, true>, q4_kernel<4, true>}};
constexpr Kernel kQ8[2][5] = {{nullptr, q8_kernel<1, false>, q8_kernel<2, false>, q8_kernel<3, false>, q8_kernel<4, false>},
                               {nullptr, q8_kernel<1, true>, q8_kernel<2, true>, q8_kernel<3, true>, q8_kernel<4, true>}};

}  // namespace

void q4_group_rows(const uint8_t* rec, const QActs& a, int64_t row0, int64_t M, const float* bias, float* y,
                   int64_t ldy, int64_t ncols) {
  kQ4[row0 == 0][std::clamp<int64_t>(M, 1, 4)](rec, a, row0, bias, y, ldy, ncols);
}

void q8_group_rows(const uint8_t* rec, const QActs& a, int64_t row0, int64_t M, const float* bias, float* y,
                   int64_t ldy, int64_t ncols) {
  kQ8[row0 == 0][std::clamp<int64_t>(M, 1, 4)](rec, a, row0, bias, y, ldy, ncols);
}

}  // namespace tm_avx512_vnni

TM_AVX512_END

#else  // not x86-64: the dispatcher never picks these (quant_gemm.cpp)
namespace tm_avx512_vnni {
void q4_group_rows(const uint8_t*, const tokenmill_quant::QActs&, int64_t, int64_t, const float*, float*, int64_t,
                   int64_t) { std::abort(); }
void q8_group_rows(const uint8_t*, const tokenmill_quant::QActs&, int64_t, int64_t, const float*, float*, int64_t,
                   int64_t) { std::abort(); }
}  // namespace tm_avx512_vnni
#endif
