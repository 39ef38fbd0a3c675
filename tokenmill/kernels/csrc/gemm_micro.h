// The AVX2 GEMM micro-kernel shared by panel_gemm.cpp (linear layers) and prefill_attention.cpp:
// an MR x 16 block of the output (MR <= 6) in 2*MR registers, 2 panel loads and MR broadcasts per k.
#pragma once

#include <cstdint>

#include "cpu_isa.h"
#include "vec_math.h"

namespace tokenmill_gemm {

constexpr int64_t NR = 16;  // panel width: two 8-float AVX2 registers

// y[r, 0:ncols] (+)= x[r, 0:K] . p for MR rows of x (row stride lda); the panel p is [K][16] (16
// output columns, zero-padded past ncols). ACC: add to y instead of overwriting it.
// SPLIT: two accumulator sets over even/odd k (few rows); batch-invariant mode runs every row
// count without it, so a row's sum has the same order in any block.
template <int MR, bool ACC = false, bool SPLIT = (MR <= 2)>
void micro_kernel(const float* x, int64_t lda, int64_t K, const float* p, const float* bias, float* y,
                  int64_t ldy, int64_t ncols) {
#ifdef __AVX2__
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  int64_t k = 0;
  if constexpr (SPLIT) {
    // Few rows: two independent accumulator sets over even/odd k hide the 4-5 cycle FMA latency.
    __m256 d0[MR], d1[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) d0[r] = d1[r] = _mm256_setzero_ps();
    for (; k + 2 <= K; k += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(p + k * NR) + 1024, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + k * NR) + 1088, _MM_HINT_T0);
      const __m256 b0 = _mm256_loadu_ps(p + k * NR), b1 = _mm256_loadu_ps(p + k * NR + 8);
      const __m256 e0 = _mm256_loadu_ps(p + k * NR + 16), e1 = _mm256_loadu_ps(p + k * NR + 24);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_broadcast_ss(x + r * lda + k), a2 = _mm256_broadcast_ss(x + r * lda + k + 1);
        c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
        c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        d0[r] = _mm256_fmadd_ps(a2, e0, d0[r]);
        d1[r] = _mm256_fmadd_ps(a2, e1, d1[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      c0[r] = _mm256_add_ps(c0[r], d0[r]);
      c1[r] = _mm256_add_ps(c1[r], d1[r]);
    }
  }
  for (; k < K; ++k) {  // every k without SPLIT; the odd last one with it
    _mm_prefetch(reinterpret_cast<const char*>(p + k * NR) + 1024, _MM_HINT_T0);
    const __m256 b0 = _mm256_loadu_ps(p + k * NR), b1 = _mm256_loadu_ps(p + k * NR + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * lda + k);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
  alignas(32) float tmp[16];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    __m256 v0 = c0[r], v1 = c1[r];
    if (bias) {
      if (ncols == NR) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(bias));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(bias + 8));
      } else {
        _mm256_store_ps(tmp, v0);
        _mm256_store_ps(tmp + 8, v1);
        for (int64_t j = 0; j < ncols; ++j) tmp[j] += bias[j];
        v0 = _mm256_load_ps(tmp);
        v1 = _mm256_load_ps(tmp + 8);
      }
    }
    float* yr = y + r * ldy;
    if (ncols == NR) {
      if constexpr (ACC) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(yr));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(yr + 8));
      }
      _mm256_storeu_ps(yr, v0);
      _mm256_storeu_ps(yr + 8, v1);
    } else {
      _mm256_store_ps(tmp, v0);
      _mm256_store_ps(tmp + 8, v1);
      for (int64_t j = 0; j < ncols; ++j) yr[j] = ACC ? yr[j] + tmp[j] : tmp[j];
    }
  }
#else
  for (int r = 0; r < MR; ++r)
    for (int64_t j = 0; j < ncols; ++j) {
      float acc = bias ? bias[j] : 0.f;
      for (int64_t k = 0; k < K; ++k) acc += x[r * lda + k] * p[k * NR + j];
      y[r * ldy + j] = ACC ? y[r * ldy + j] + acc : acc;
    }
#endif
}

using MicroKernel = void (*)(const float*, int64_t, int64_t, const float*, const float*, float*, int64_t, int64_t);

// kMicroKernels<ACC>[MR], MR = 1..6
template <bool ACC>
constexpr MicroKernel kMicroKernels[7] = {nullptr, micro_kernel<1, ACC>, micro_kernel<2, ACC>, micro_kernel<3, ACC>,
                                          micro_kernel<4, ACC>, micro_kernel<5, ACC>, micro_kernel<6, ACC>};
template <bool ACC>
constexpr MicroKernel kMicroKernelsInvariant[7] = {
    nullptr, micro_kernel<1, ACC, false>, micro_kernel<2, ACC, false>, micro_kernel<3, ACC, false>,
    micro_kernel<4, ACC, false>, micro_kernel<5, ACC, false>, micro_kernel<6, ACC, false>};

// y[M, ncols] (+)= x[M, K] . panel, in row blocks of at most 6, as even as possible (8 -> 4 + 4).
template <bool ACC>
inline void panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const float* panel, const float* bias,
                       float* y, int64_t ldy, int64_t ncols) {
  if (M <= 0) return;
  const MicroKernel* kernels = tokenmill_isa::batch_invariant() ? kMicroKernelsInvariant<ACC> : kMicroKernels<ACC>;
  const int64_t nblocks = (M + 5) / 6, base = M / nblocks, extra = M % nblocks;
  for (int64_t blk = 0, r0 = 0; blk < nblocks; ++blk) {
    const int64_t rows = base + (blk < extra ? 1 : 0);
    kernels[rows](x + r0 * lda, lda, K, panel, bias, y + r0 * ldy, ldy, ncols);
    r0 += rows;
  }
}


}  // namespace tokenmill_gemm
