// Block-quantized weights (GGUF Q4_0 / Q4_1 / Q8_0 and our int4 / int8) in one packed layout, and
// the per-ISA row kernels that multiply them with int8-quantized activations. No ATen here: the
// AVX-512 unit includes this under a target pragma.
//
// Layout (built once at load by tokenmill::pack_q4 / pack_q8, quant_gemm.cpp): output rows in groups
// of 16, K in blocks of 32. One record per (group, block), records of a group contiguous:
//   q4: [4][16 rows][4 bytes] codes: byte (j, r, e) = code(r, 4j+e) | code(r, 16+4j+e) << 4,
//       codes 0..15, then d[16] and m[16] as float16: w = d * code + m (Q4_0: m = -8 d)
//   q8: [8][16 rows][4 bytes] int8 codes: byte (j, r, e) = code(r, 4j+e), then d[16] float16 and
//       s[16] float32 = d * sum(codes of the block) (w = d * code)
// Each 64-byte row of a record is one zmm whose 32-bit lane r holds 4 consecutive k of output row r:
// the operand of vpdpbusd with 4 activation bytes broadcast, and of vpmaddubsw on AVX2.
//
// Activations: per row and 32-block, dx = max|x| / 127, qx = nearbyint(x / dx) in int8, and
// sx = dx * sum(qx) (what the Q4 minimum multiplies); the q8 kernels read qx + 128 as unsigned.
#pragma once

#include <cstdint>

namespace tokenmill_quant {
constexpr int64_t kGroupRows = 16;
constexpr int64_t kBlockK = 32;
constexpr int64_t kQ4Record = 4 * 64 + 16 * 2 + 16 * 2;  // 320 bytes per 16 rows x 32 k
constexpr int64_t kQ8Record = 8 * 64 + 16 * 2 + 16 * 4;  // 608

// The record ~5 KB ahead of `record` (of `size` bytes) into L1, one prefetch a cache line, issued as
// each record is read: the weights of a decode step stream from DRAM once, and the hardware
// prefetcher alone ramps up too late in calls this small (the default model's linear layers hold
// 200 KB-1.1 MB each). Measured on machine D (docs/BENCHMARKS.md, session 35): the 30 layers' q4
// GEMVs 2.67 -> 2.24-2.38 ms, flat from 16 to 32 records ahead, less at 4-8 and at 64.
constexpr int64_t kPrefetchBytes = 5120;
template <int64_t Size>
inline void prefetch_record_ahead(const uint8_t* record) {
  constexpr int64_t ahead = (kPrefetchBytes + Size - 1) / Size * Size;
#pragma GCC unroll 10
  for (int64_t off = 0; off < Size; off += 64) __builtin_prefetch(record + ahead + off, 0, 3);
}

// Quantized activation rows: M rows of K int8 codes (qx, and qx + 128 as uint8 in qxu), nb = K / 32
// scales dx and sums sx per row.
struct QActs {
  const int8_t* qx;
  const uint8_t* qxu;
  const float* dx;
  const float* sx;
  int64_t K, nb;
};
}  // namespace tokenmill_quant

// y[M, 16 of group] (+bias), M <= 4 rows of activations from row0, one group's records
#define TM_QUANT_KERNELS                                                                                        \
  void q4_group_rows(const uint8_t* records, const tokenmill_quant::QActs& a, int64_t row0, int64_t M,          \
                     const float* bias, float* y, int64_t ldy, int64_t ncols);                                  \
  void q8_group_rows(const uint8_t* records, const tokenmill_quant::QActs& a, int64_t row0, int64_t M,          \
                     const float* bias, float* y, int64_t ldy, int64_t ncols);

namespace tm_avx512_vnni { TM_QUANT_KERNELS }
namespace tm_avx2_quant { TM_QUANT_KERNELS }
namespace tm_scalar_quant { TM_QUANT_KERNELS }
