// Panel-packed float32 GEMM for decode-sized batches: y[M, N] = x[M, K] @ W[N, K]^T (+ bias).
//
// The weight is packed once, at load, into panels of 16 output columns: P[N/16][K][16] (the last
// panel zero-padded). A panel is read sequentially, so at small M the kernel streams the weight at
// close to read bandwidth, and from ~6 rows up it is compute-bound: the micro-kernel keeps an
// MR x 16 block of y in 2*MR AVX2 registers (MR <= 6: 12 accumulators, 2 weight loads and MR
// broadcasts per k step), reusing each panel from L2 for every block of rows. oneDNN reached
// 35-57 GFLOP/s at 5-64 rows here; its large-M kernels stay in use for prefill.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "vec_math.h"

namespace {

constexpr int64_t NR = 16;  // panel width: two 8-float AVX2 registers

// y[r, n0:n0+ncols] for MR rows starting at x (row stride K); panel p is [K][16].
template <int MR>
void micro_kernel(const float* x, int64_t K, const float* p, const float* bias, float* y, int64_t ldy,
                  int64_t ncols) {
#ifdef __AVX2__
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  if constexpr (MR <= 2) {
    // Few rows: two independent accumulator sets over even/odd k hide the 4-5 cycle FMA latency.
    __m256 d0[MR], d1[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) d0[r] = d1[r] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(p + k * NR) + 1024, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + k * NR) + 1088, _MM_HINT_T0);
      const __m256 b0 = _mm256_loadu_ps(p + k * NR), b1 = _mm256_loadu_ps(p + k * NR + 8);
      const __m256 e0 = _mm256_loadu_ps(p + k * NR + 16), e1 = _mm256_loadu_ps(p + k * NR + 24);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_broadcast_ss(x + r * K + k), a2 = _mm256_broadcast_ss(x + r * K + k + 1);
        c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
        c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        d0[r] = _mm256_fmadd_ps(a2, e0, d0[r]);
        d1[r] = _mm256_fmadd_ps(a2, e1, d1[r]);
      }
    }
    for (; k < K; ++k) {
      const __m256 b0 = _mm256_loadu_ps(p + k * NR), b1 = _mm256_loadu_ps(p + k * NR + 8);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_broadcast_ss(x + r * K + k);
        c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
        c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      c0[r] = _mm256_add_ps(c0[r], d0[r]);
      c1[r] = _mm256_add_ps(c1[r], d1[r]);
    }
  } else {
    for (int64_t k = 0; k < K; ++k) {
      _mm_prefetch(reinterpret_cast<const char*>(p + k * NR) + 1024, _MM_HINT_T0);
      const __m256 b0 = _mm256_loadu_ps(p + k * NR), b1 = _mm256_loadu_ps(p + k * NR + 8);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_broadcast_ss(x + r * K + k);
        c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
        c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
      }
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
      _mm256_storeu_ps(yr, v0);
      _mm256_storeu_ps(yr + 8, v1);
    } else {
      _mm256_store_ps(tmp, v0);
      _mm256_store_ps(tmp + 8, v1);
      std::copy(tmp, tmp + ncols, yr);
    }
  }
#else
  for (int r = 0; r < MR; ++r)
    for (int64_t j = 0; j < ncols; ++j) {
      float acc = bias ? bias[j] : 0.f;
      for (int64_t k = 0; k < K; ++k) acc += x[r * K + k] * p[k * NR + j];
      y[r * ldy + j] = acc;
    }
#endif
}

using Kernel = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t, int64_t);
constexpr Kernel kKernels[7] = {nullptr, micro_kernel<1>, micro_kernel<2>, micro_kernel<3>,
                                micro_kernel<4>, micro_kernel<5>, micro_kernel<6>};

at::Tensor pack_panels(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2, "weight [N, K] float32");
  auto w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), panels = (N + NR - 1) / NR;
  auto packed = at::zeros({panels, K, NR}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pi = begin; pi < end; ++pi)
      for (int64_t j = 0; j < std::min(NR, N - pi * NR); ++j) {
        const float* row = src + (pi * NR + j) * K;
        float* col = dst + pi * K * NR + j;
        for (int64_t k = 0; k < K; ++k) col[k * NR] = row[k];
      }
  });
  return packed;
}

at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == NR && x.size(1) == packed.size(1),
              "x [M, K], packed [N/16, K, 16]");
  TORCH_CHECK(packed.size(0) == (N + NR - 1) / NR && packed.is_contiguous(), "packed does not hold N columns");
  auto xc = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  auto y = at::empty({M, N}, x.options());
  const float* b = nullptr;
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    bc = bias->contiguous();
    TORCH_CHECK(bc.numel() == N && bc.scalar_type() == at::kFloat, "bias [N] float32");
    b = bc.data_ptr<float>();
  }
  if (M == 0) return y;
  const float* xp = xc.data_ptr<float>();
  const float* pp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Each thread owns a range of panels; rows go in chunks whose x slice stays in L2 while the
  // thread's panels stream past it (the weight is read once per chunk, once in all at decode sizes).
  constexpr int64_t kChunkRows = 96;
  at::parallel_for(0, panels, 4, [&](int64_t begin, int64_t end) {
    for (int64_t c0 = 0; c0 < M; c0 += kChunkRows) {
      const int64_t rows_c = std::min(kChunkRows, M - c0);
      const int64_t nblocks = (rows_c + 5) / 6, base = rows_c / nblocks, extra = rows_c % nblocks;
      for (int64_t pi = begin; pi < end; ++pi) {
        const int64_t n0 = pi * NR, ncols = std::min(NR, N - n0);
        const float* panel = pp + pi * K * NR;
        int64_t r0 = c0;
        for (int64_t blk = 0; blk < nblocks; ++blk) {  // blocks of at most 6 rows, as even as possible
          const int64_t rows = base + (blk < extra ? 1 : 0);
          kKernels[rows](xp + r0 * K, K, panel, b ? b + n0 : nullptr, yp + r0 * N + n0, N, ncols);
          r0 += rows;
        }
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tokenmill, m) {
  m.def("pack_panels(Tensor weight) -> Tensor");
  m.def("panel_linear(Tensor x, Tensor packed, int N, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokenmill, CPU, m) {
  m.impl("pack_panels", &pack_panels);
  m.impl("panel_linear", &panel_linear);
}
