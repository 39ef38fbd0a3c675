// Activations quantized for the block kernels, and the row kernel the active ISA level picks: shared by
// quant_gemm.cpp (q4_linear, q8_linear) and quant_argmax.cpp (the greedy LM head).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "cpu_isa.h"
#include "ops.h"
#include "quant_isa.h"

namespace tokenmill_quant {

using RowsFn = void (*)(const uint8_t*, const QActs&, int64_t, int64_t, const float*, float*, int64_t, int64_t);

struct QActsStorage {
  at::Tensor codes, scales;  // one allocation each: [qx | qxu] bytes, [dx | sx] floats
  QActs view;
};

// records: the packed [N, K] weight of `bits` (4 or 8) as pack_q4 / pack_q8 lay it out (quant_isa.h)
inline void check_records(const at::Tensor& records, int64_t bits, int64_t N, int64_t K) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits: 4 or 8");
  TORCH_CHECK(K % kBlockK == 0, "K must be a multiple of 32, got ", K);
  const int64_t groups = (N + kGroupRows - 1) / kGroupRows, rec_size = bits == 4 ? kQ4Record : kQ8Record;
  TORCH_CHECK(records.scalar_type() == at::kByte && records.is_contiguous() &&
                  records.numel() == groups * (K / kBlockK) * rec_size,
              "records do not hold [", N, ", ", K, "] (q", bits, ")");
}

// Activation rows per pass over a thread's weights: their int8 codes stay in L2 while the records
// stream past.
inline int64_t rows_per_pass(int64_t K) { return std::clamp<int64_t>((256 << 10) / K, 16, 1024); }

// x [M, K] float32 -> int8 codes per row and 32-block (quant_isa.h)
inline QActsStorage quantize_rows(const at::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1), nb = K / kBlockK;
  QActsStorage s;
  s.codes = tokenmill_ops::new_tensor({2 * M * K}, x.options().dtype(at::kByte));
  s.scales = tokenmill_ops::new_tensor({2 * M * nb}, x.options().dtype(at::kFloat));
  const float* xp = x.data_ptr<float>();
  int8_t* q = reinterpret_cast<int8_t*>(s.codes.data_ptr<uint8_t>());
  uint8_t* qu = s.codes.data_ptr<uint8_t>() + M * K;
  float* dx = s.scales.data_ptr<float>();
  float* sx = dx + M * nb;
  at::parallel_for(0, M * nb, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* v = xp + (t / nb) * K + (t % nb) * kBlockK;
      float amax = 0.f;
      for (int k = 0; k < kBlockK; ++k) amax = std::max(amax, std::fabs(v[k]));
      const float d = amax / 127.f, id = d > 0.f ? 127.f / amax : 0.f;
      int32_t sum = 0;
      int8_t* qb = q + (t / nb) * K + (t % nb) * kBlockK;
      uint8_t* qub = qu + (t / nb) * K + (t % nb) * kBlockK;
      for (int k = 0; k < kBlockK; ++k) {
        const int32_t c = static_cast<int32_t>(std::nearbyint(v[k] * id));
        qb[k] = static_cast<int8_t>(c);
        qub[k] = static_cast<uint8_t>(c + 128);
        sum += c;
      }
      dx[t] = d;
      sx[t] = d * static_cast<float>(sum);
    }
  });
  s.view = QActs{q, qu, dx, sx, K, nb};
  return s;
}

inline RowsFn pick(bool q4) {
  using tokenmill_isa::Level;
  const auto level = tokenmill_isa::active_level();
#if defined(__x86_64__) && defined(__GNUC__)
  if (level >= Level::kAvx512 && tokenmill_isa::cpu_isa().avx512vnni)
    return q4 ? tm_avx512_vnni::q4_group_rows : tm_avx512_vnni::q8_group_rows;
#endif
#ifdef __AVX2__
  if (level >= Level::kAvx2) return q4 ? tm_avx2_quant::q4_group_rows : tm_avx2_quant::q8_group_rows;
#endif
  return q4 ? tm_scalar_quant::q4_group_rows : tm_scalar_quant::q8_group_rows;
}

}  // namespace tokenmill_quant
