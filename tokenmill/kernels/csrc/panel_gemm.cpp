// Panel-packed float32 GEMM for every linear layer (AVX2 micro-kernel here, the AVX-512 one in
// gemm_avx512.cpp where the CPU has it): y[M, N] = x[M, K] @ W[N, K]^T (+ bias).
//
// The weight is packed once, at load, into panels of 16 output columns: P[N/16][K][16] (the last
// panel zero-padded). A panel is read sequentially, so at small M the kernel streams the weight at
// close to read bandwidth, and from ~6 rows up it is compute-bound: the micro-kernel
// (gemm_micro.h) keeps an MR x 16 block of y in registers, reusing each panel from L2 for every
// block of rows. Measured against oneDNN with a prepacked weight: docs/BENCHMARKS.md, "GEMM"
// (`python -m tokenmill.bench.kernels`).
#include <ATen/Parallel.h>

#include <algorithm>

#include "cpu_isa.h"
#include "gemm_isa.h"
#include "gemm_micro.h"
#include "gemm_split.h"
#include "ops.h"

namespace {

using tokenmill_gemm::NR;

}  // namespace

namespace tokenmill_ops {

at::Tensor pack_panels(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2, "weight [N, K] float32");
  auto w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), panels = (N + NR - 1) / NR;
  auto packed = w.new_zeros({panels, K, NR});
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
  auto y = new_tensor({M, N}, x.options());
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
  // Each task owns a range of panels (and of rows, for prompt-sized M: gemm_split.h); rows go in chunks
  // whose x slice stays in L2 while the task's panels stream past it (the weight is read once per chunk,
  // once in all at decode sizes).
  constexpr int64_t kChunkRows = 96;
  const bool avx512 = tokenmill_isa::active_level() >= tokenmill_isa::Level::kAvx512;
  // from 8 rows AVX-512 takes adjacent panels two at a time (one broadcast of x per two FMAs); fewer rows
  // stream the weights, and batch-invariant mode keeps the single-panel kernels' one order
  const int64_t span = avx512 && M >= 8 && !tokenmill_isa::batch_invariant() ? 2 : 1;
  tokenmill_gemm::parallel_units_rows((panels + span - 1) / span, M, 4 / span, [&](int64_t begin, int64_t end,
                                                                                  int64_t r0, int64_t r1) {
    for (int64_t c0 = r0; c0 < r1; c0 += kChunkRows) {
      const int64_t rows_c = std::min(kChunkRows, r1 - c0);
      for (int64_t pi = begin * span; pi < std::min(end * span, panels); pi += span) {
        const int64_t n0 = pi * NR;
        const float* panel = pp + pi * K * NR;
        if (span == 2 && pi + 1 < panels)
          tm_avx512::f32_panel_pair_rows(xp + c0 * K, K, rows_c, K, panel, panel + K * NR, b ? b + n0 : nullptr,
                                         yp + c0 * N + n0, N, std::min(2 * NR, N - n0));
        else if (avx512)
          tm_avx512::f32_panel_rows(xp + c0 * K, K, rows_c, K, panel, b ? b + n0 : nullptr, yp + c0 * N + n0, N,
                                    std::min(NR, N - n0));
        else
          tokenmill_gemm::panel_rows<false>(xp + c0 * K, K, rows_c, K, panel, b ? b + n0 : nullptr, yp + c0 * N + n0,
                                            N, std::min(NR, N - n0));
      }
    }
  });
  return y;
}

}  // namespace tokenmill_ops
