// Linear layers on block-quantized weights (quant_isa.h has the layout): y[M, N] = x[M, K] W^T (+ b)
// with W held as 4- or 8-bit codes and per-32 scales, float32 x quantized to int8 per row and block
// on the fly, integer dot products per block, scaled and summed in float32.
//
//   pack_q4(codes [N, K] uint8 0..15, d [N, K/32], m [N, K/32]) -> records   (w = d * code + m)
//   pack_q8(codes [N, K] int8, d [N, K/32]) -> records                       (w = d * code)
//   q4_linear / q8_linear(x [M, K] float32, records, N, bias?) -> y [M, N] float32
//   q_dequantize(records, bits, N, K) -> W [N, K] float32                 (what the codes stand for)
//   q_dequantize_rows(records, bits, N, K, ids [T]) -> [T, K] float32     (an embedding lookup)
//
// Per call the active ISA level (cpu_isa.h) picks the row kernel: AVX-512 VNNI (vpdpbusd,
// quant_avx512.cpp), AVX2 (vpmaddubsw), or scalar C++ on any CPU.
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_isa.h"
#include "gemm_split.h"
#include "ops.h"
#include "quant_acts.h"
#include "quant_isa.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

using tokenmill_quant::kBlockK;
using tokenmill_quant::kGroupRows;
using tokenmill_quant::kQ4Record;
using tokenmill_quant::kQ8Record;
using tokenmill_quant::QActs;

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

inline void float_to_half(float f, uint8_t* p) {
  const uint16_t h = c10::Half(f).x;
  std::memcpy(p, &h, 2);
}

}  // namespace

namespace tm_scalar_quant {

void q4_group_rows(const uint8_t* rec, const QActs& a, int64_t row0, int64_t M, const float* bias, float* y,
                   int64_t ldy, int64_t ncols) {
  for (int64_t i = 0; i < M; ++i) {
    const int64_t row = row0 + i;
    for (int64_t r = 0; r < ncols; ++r) {
      float acc = 0.f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const uint8_t* R = rec + b * kQ4Record;
        const int8_t* xb = a.qx + row * a.K + b * kBlockK;
        int32_t isum = 0;
        for (int j = 0; j < 4; ++j)
          for (int e = 0; e < 4; ++e) {
            const uint8_t byte = R[j * 64 + r * 4 + e];
            isum += (byte & 0x0F) * xb[4 * j + e] + (byte >> 4) * xb[16 + 4 * j + e];
          }
        const float d = half_to_float(R + 256 + 2 * r), m = half_to_float(R + 288 + 2 * r);
        acc += static_cast<float>(isum) * (d * a.dx[row * a.nb + b]) + m * a.sx[row * a.nb + b];
      }
      y[i * ldy + r] = bias ? acc + bias[r] : acc;
    }
  }
}

void q8_group_rows(const uint8_t* rec, const QActs& a, int64_t row0, int64_t M, const float* bias, float* y,
                   int64_t ldy, int64_t ncols) {
  for (int64_t i = 0; i < M; ++i) {
    const int64_t row = row0 + i;
    for (int64_t r = 0; r < ncols; ++r) {
      float acc = 0.f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const uint8_t* R = rec + b * kQ8Record;
        const int8_t* xb = a.qx + row * a.K + b * kBlockK;
        int32_t isum = 0;
        for (int j = 0; j < 8; ++j)
          for (int e = 0; e < 4; ++e) isum += static_cast<int8_t>(R[j * 64 + r * 4 + e]) * xb[4 * j + e];
        const float d = half_to_float(R + 512 + 2 * r);
        acc += static_cast<float>(isum) * (d * a.dx[row * a.nb + b]);
      }
      y[i * ldy + r] = bias ? acc + bias[r] : acc;
    }
  }
}

}  // namespace tm_scalar_quant

namespace tm_avx2_quant {
#ifdef __AVX2__
namespace {

inline __m256i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// rows h*8 .. h*8+7 of the group (one ymm half of each 64-byte record row)
// Prefetch: the first pass over the group's records (half 0 of rows from 0), which stream from DRAM.
template <int MR, bool Prefetch>
void q4_half(const uint8_t* rec, const QActs& a, int64_t row0, int h, __m256 acc[MR]) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* R = rec + b * kQ4Record;
    if constexpr (Prefetch) tokenmill_quant::prefetch_record_ahead<kQ4Record>(R);
    __m256i lo[4], hi[4];
    for (int j = 0; j < 4; ++j) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(R + j * 64 + h * 32));
      lo[j] = _mm256_and_si256(w, low);
      hi[j] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(R + 256 + h * 16)));
    const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(R + 288 + h * 16)));
    for (int i = 0; i < MR; ++i) {
      const int64_t row = row0 + i;
      const int8_t* xb = a.qx + row * a.K + b * kBlockK;
      // |code * x| pairs <= 2 * 15 * 127: eight of them still fit an int16
      __m256i s = _mm256_maddubs_epi16(lo[0], bcast4(xb));
      s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[0], bcast4(xb + 16)));
      for (int j = 1; j < 4; ++j) {
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[j], bcast4(xb + 4 * j)));
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[j], bcast4(xb + 16 + 4 * j)));
      }
      const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(s, ones));
      acc[i] = _mm256_fmadd_ps(f, _mm256_mul_ps(d, _mm256_set1_ps(a.dx[row * a.nb + b])), acc[i]);
      acc[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.sx[row * a.nb + b]), acc[i]);
    }
  }
}

template <int MR, bool Prefetch>
void q8_half(const uint8_t* rec, const QActs& a, int64_t row0, int h, __m256 acc[MR]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* R = rec + b * kQ8Record;
    if constexpr (Prefetch) tokenmill_quant::prefetch_record_ahead<kQ8Record>(R);
    __m256i w[8], aw[8];
    for (int j = 0; j < 8; ++j) {
      w[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(R + j * 64 + h * 32));
      aw[j] = _mm256_abs_epi8(w[j]);
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(R + 512 + h * 16)));
    for (int i = 0; i < MR; ++i) {
      const int64_t row = row0 + i;
      const int8_t* xb = a.qx + row * a.K + b * kBlockK;
      __m256i s = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j)  // |w| * (x with w's sign): signed x signed through the u8 x s8 multiply
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(bcast4(xb + 4 * j), w[j])),
                                                  ones));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(a.dx[row * a.nb + b])), acc[i]);
    }
  }
}

template <int MR, bool Q4>
void group_rows(const uint8_t* rec, const QActs& a, int64_t row0, const float* bias, float* y, int64_t ldy,
                int64_t ncols) {
  for (int h = 0; h < 2 && h * 8 < ncols; ++h) {
    __m256 acc[MR];
    for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
    const bool first = h == 0 && row0 == 0;
    if constexpr (Q4) first ? q4_half<MR, true>(rec, a, row0, h, acc) : q4_half<MR, false>(rec, a, row0, h, acc);
    else first ? q8_half<MR, true>(rec, a, row0, h, acc) : q8_half<MR, false>(rec, a, row0, h, acc);
    alignas(32) float tmp[8];
    const int64_t cols = std::min<int64_t>(8, ncols - h * 8);
    for (int i = 0; i < MR; ++i) {
      _mm256_store_ps(tmp, acc[i]);
      for (int64_t c = 0; c < cols; ++c) y[i * ldy + h * 8 + c] = bias ? tmp[c] + bias[h * 8 + c] : tmp[c];
    }
  }
}

template <bool Q4>
void dispatch_rows(const uint8_t* rec, const QActs& a, int64_t row0, int64_t M, const float* bias, float* y,
                   int64_t ldy, int64_t ncols) {
  switch (M) {
    case 1: return group_rows<1, Q4>(rec, a, row0, bias, y, ldy, ncols);
    case 2: return group_rows<2, Q4>(rec, a, row0, bias, y, ldy, ncols);
    case 3: return group_rows<3, Q4>(rec, a, row0, bias, y, ldy, ncols);
    default: return group_rows<4, Q4>(rec, a, row0, bias, y, ldy, ncols);
  }
}
}  // namespace
#endif

void q4_group_rows(const uint8_t* rec, const QActs& a, int64_t row0, int64_t M, const float* bias, float* y,
                   int64_t ldy, int64_t ncols) {
#ifdef __AVX2__
  dispatch_rows<true>(rec, a, row0, M, bias, y, ldy, ncols);
#else
  tm_scalar_quant::q4_group_rows(rec, a, row0, M, bias, y, ldy, ncols);
#endif
}

void q8_group_rows(const uint8_t* rec, const QActs& a, int64_t row0, int64_t M, const float* bias, float* y,
                   int64_t ldy, int64_t ncols) {
#ifdef __AVX2__
  dispatch_rows<false>(rec, a, row0, M, bias, y, ldy, ncols);
#else
  tm_scalar_quant::q8_group_rows(rec, a, row0, M, bias, y, ldy, ncols);
#endif
}
}  // namespace tm_avx2_quant


namespace {

using tokenmill_quant::check_records;
using tokenmill_quant::pick;
using tokenmill_quant::QActsStorage;
using tokenmill_quant::quantize_rows;
using tokenmill_quant::RowsFn;
using tokenmill_quant::rows_per_pass;


at::Tensor q_linear(const at::Tensor& x, const at::Tensor& records, int64_t N, const c10::optional<at::Tensor>& bias,
                    bool q4) {
  TORCH_CHECK(x.dim() == 2, "x: [M, K]");
  const int64_t M = x.size(0), K = x.size(1), nb = K / kBlockK, groups = (N + kGroupRows - 1) / kGroupRows;
  const int64_t rec_size = q4 ? kQ4Record : kQ8Record;
  check_records(records, q4 ? 4 : 8, N, K);
  auto y = tokenmill_ops::new_tensor({M, N}, x.options().dtype(at::kFloat));
  if (M == 0) return y;
  at::Tensor bc;
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    bc = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(bc.numel() == N, "bias: [N]");
    b = bc.data_ptr<float>();
  }
  const at::Tensor xc = x.to(at::kFloat).contiguous();
  const QActsStorage acts = quantize_rows(xc);
  const RowsFn rows_fn = pick(q4);
  const uint8_t* rp = records.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t chunk = rows_per_pass(K);
  tokenmill_gemm::parallel_units_rows(groups, M, 4, [&](int64_t begin, int64_t end, int64_t rb, int64_t re) {
    for (int64_t c0 = rb; c0 < re; c0 += chunk) {
      const int64_t c1 = std::min(re, c0 + chunk);
      for (int64_t g = begin; g < end; ++g) {
        const int64_t n0 = g * kGroupRows, ncols = std::min(kGroupRows, N - n0);
        for (int64_t r0 = c0; r0 < c1; r0 += 4)
          rows_fn(rp + g * nb * rec_size, acts.view, r0, std::min<int64_t>(4, c1 - r0), b ? b + n0 : nullptr,
                  yp + r0 * N + n0, N, ncols);
      }
    }
  });
  return y;
}

void check_scales(const at::Tensor& t, int64_t N, int64_t nb, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == N && t.size(1) == nb, name, ": [N, K/32] = [", N, ", ", nb, "]");
}

void dequantize_rows(const uint8_t* rp, int64_t bits, int64_t N, int64_t K, const int64_t* ids, int64_t count,
                     float* wp) {
  const int64_t nb = K / kBlockK, rec_size = bits == 4 ? kQ4Record : kQ8Record;
  at::parallel_for(0, count, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = ids ? ids[i] : i;
      TORCH_CHECK(n >= 0 && n < N, "row ", n, " out of range [0, ", N, ")");
      const int64_t g = n / kGroupRows, r = n % kGroupRows;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* R = rp + (g * nb + b) * rec_size;
        float* out = wp + i * K + b * kBlockK;
        if (bits == 4) {
          const float d = half_to_float(R + 256 + 2 * r), m = half_to_float(R + 288 + 2 * r);
          for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e) {
              const uint8_t byte = R[j * 64 + r * 4 + e];
              out[4 * j + e] = d * (byte & 0x0F) + m;
              out[16 + 4 * j + e] = d * (byte >> 4) + m;
            }
        } else {
          const float d = half_to_float(R + 512 + 2 * r);
          for (int k = 0; k < kBlockK; ++k) out[k] = d * static_cast<int8_t>(R[(k / 4) * 64 + r * 4 + (k % 4)]);
        }
      }
    }
  });
}

}  // namespace

namespace tokenmill_ops {

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& records, int64_t N, const c10::optional<at::Tensor>& bias) {
  return q_linear(x, records, N, bias, true);
}

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& records, int64_t N, const c10::optional<at::Tensor>& bias) {
  return q_linear(x, records, N, bias, false);
}

at::Tensor pack_q4(const at::Tensor& codes, const at::Tensor& d, const at::Tensor& m) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.dim() == 2, "codes: [N, K] uint8 in 0..15");
  const int64_t N = codes.size(0), K = codes.size(1), nb = K / kBlockK, groups = (N + kGroupRows - 1) / kGroupRows;
  TORCH_CHECK(K % kBlockK == 0, "K must be a multiple of 32, got ", K);
  check_scales(d, N, nb, "d");
  check_scales(m, N, nb, "m");
  auto c = codes.contiguous();
  auto df = d.to(at::kFloat).contiguous(), mf = m.to(at::kFloat).contiguous();
  auto out = codes.new_zeros({groups * nb * kQ4Record});
  const uint8_t* cp = c.data_ptr<uint8_t>();
  const float *dp = df.data_ptr<float>(), *mp = mf.data_ptr<float>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* R = op + (g * nb + b) * kQ4Record;
        for (int64_t r = 0; r < std::min(kGroupRows, N - g * kGroupRows); ++r) {
          const int64_t n = g * kGroupRows + r;
          const uint8_t* src = cp + n * K + b * kBlockK;
          for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e)
              R[j * 64 + r * 4 + e] = static_cast<uint8_t>((src[4 * j + e] & 0x0F) | (src[16 + 4 * j + e] & 0x0F) << 4);
          float_to_half(dp[n * nb + b], R + 256 + 2 * r);
          float_to_half(mp[n * nb + b], R + 288 + 2 * r);
        }
      }
  });
  return out;
}

at::Tensor pack_q8(const at::Tensor& codes, const at::Tensor& d) {
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.dim() == 2, "codes: [N, K] int8");
  const int64_t N = codes.size(0), K = codes.size(1), nb = K / kBlockK, groups = (N + kGroupRows - 1) / kGroupRows;
  TORCH_CHECK(K % kBlockK == 0, "K must be a multiple of 32, got ", K);
  check_scales(d, N, nb, "d");
  auto c = codes.contiguous();
  auto df = d.to(at::kFloat).contiguous();
  auto out = codes.new_zeros({groups * nb * kQ8Record}, codes.options().dtype(at::kByte));
  const int8_t* cp = c.data_ptr<int8_t>();
  const float* dp = df.data_ptr<float>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* R = op + (g * nb + b) * kQ8Record;
        for (int64_t r = 0; r < std::min(kGroupRows, N - g * kGroupRows); ++r) {
          const int64_t n = g * kGroupRows + r;
          const int8_t* src = cp + n * K + b * kBlockK;
          int32_t sum = 0;
          for (int k = 0; k < kBlockK; ++k) {
            R[(k / 4) * 64 + r * 4 + (k % 4)] = static_cast<uint8_t>(src[k]);
            sum += src[k];
          }
          float_to_half(dp[n * nb + b], R + 512 + 2 * r);
          const float d16 = half_to_float(R + 512 + 2 * r);  // the scale the kernels will read
          const float s = d16 * static_cast<float>(sum);
          std::memcpy(R + 544 + 4 * r, &s, 4);
        }
      }
  });
  return out;
}

// rows ids[i] of W -> out[i, K] float32
at::Tensor q_dequantize(const at::Tensor& records, int64_t bits, int64_t N, int64_t K) {
  check_records(records, bits, N, K);
  auto w = new_tensor({N, K}, records.options().dtype(at::kFloat));
  dequantize_rows(records.data_ptr<uint8_t>(), bits, N, K, nullptr, N, w.data_ptr<float>());
  return w;
}

at::Tensor q_dequantize_rows(const at::Tensor& records, int64_t bits, int64_t N, int64_t K, const at::Tensor& ids) {
  check_records(records, bits, N, K);
  TORCH_CHECK(ids.dim() == 1, "ids: [T]");
  const at::Tensor idc = ids.to(at::kLong).contiguous();
  auto w = new_tensor({idc.size(0), K}, records.options().dtype(at::kFloat));
  dequantize_rows(records.data_ptr<uint8_t>(), bits, N, K, idc.data_ptr<int64_t>(), idc.size(0), w.data_ptr<float>());
  return w;
}

}  // namespace tokenmill_ops
