// bf16-weight GEMM for every linear layer when the model dtype is bfloat16:
// y[M, N] (float32) = x[M, K] @ W[N, K]^T (+ bias), W packed once at load into bf16 panels of 32
// output columns (gemm_isa.h). Activations stay float32 around it (norms, RoPE, attention run on
// float32 rows); the bf16 weights halve the bytes a decode step streams. The per-call path follows
// the active ISA level (cpu_isa.h):
//   avx512_bf16: x rounded to bf16 once per call, vdpbf16ps (gemm_avx512.cpp)
//   avx512 / avx2: bf16 weights widened to float32 in registers, float32 FMA
//   scalar: the same arithmetic in plain C++ (any CPU)
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <vector>
#include <cstring>

#include "cpu_isa.h"
#include "gemm_isa.h"
#include "gemm_split.h"
#include "ops.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

using tokenmill_gemm::kBf16PanelCols;
using tokenmill_gemm::kBf16PanelPairStride;

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

namespace tm_scalar {
void bf16_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel, const float* bias,
                     float* y, int64_t ldy, int64_t ncols) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < ncols; ++j) {
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k) acc += x[r * lda + k] * bf16_to_float(panel[(k / 2) * kBf16PanelPairStride + 2 * j + (k & 1)]);
      y[r * ldy + j] = bias ? acc + bias[j] : acc;
    }
}
}  // namespace tm_scalar

namespace tm_avx2 {
#ifdef __AVX2__
namespace {
// An MR x 16 block (one half of a 32-column panel): 2 x 8 lanes, each lane a (k, k+1) pair widened
// by a shift (k) and a mask (k+1).
template <int MR>
void half_kernel(const float* x, int64_t lda, int64_t K, const uint16_t* p, const float* bias, float* y, int64_t ldy,
                 int64_t ncols) {
  __m256 c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const int64_t pairs = (K + 1) / 2;
  for (int64_t kk = 0; kk < pairs; ++kk) {
    const uint16_t* pk = p + kk * kBf16PanelPairStride;
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pk));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pk + 16));
    const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hi));
    const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hi));
    const bool odd = 2 * kk + 1 < K;
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * lda + 2 * kk);
      c0[r] = _mm256_fmadd_ps(a, e0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, e1, c1[r]);
      if (odd) {
        const __m256 a2 = _mm256_broadcast_ss(x + r * lda + 2 * kk + 1);
        c0[r] = _mm256_fmadd_ps(a2, o0, c0[r]);
        c1[r] = _mm256_fmadd_ps(a2, o1, c1[r]);
      }
    }
  }
  alignas(32) float tmp[16];
  for (int r = 0; r < MR; ++r) {
    _mm256_store_ps(tmp, c0[r]);
    _mm256_store_ps(tmp + 8, c1[r]);
    for (int64_t j = 0; j < ncols; ++j) y[r * ldy + j] = bias ? tmp[j] + bias[j] : tmp[j];
  }
}

using HalfFn = void (*)(const float*, int64_t, int64_t, const uint16_t*, const float*, float*, int64_t, int64_t);
constexpr HalfFn kHalf[] = {nullptr, half_kernel<1>, half_kernel<2>, half_kernel<3>, half_kernel<4>};
}  // namespace
#endif

void bf16_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel, const float* bias,
                     float* y, int64_t ldy, int64_t ncols) {
#ifdef __AVX2__
  for (int64_t h = 0; h < 2 && h * 16 < ncols; ++h) {
    const int64_t cols = std::min<int64_t>(16, ncols - h * 16);
    for (int64_t r0 = 0; r0 < M; r0 += 4) {
      const int64_t rows = std::min<int64_t>(4, M - r0);
      kHalf[rows](x + r0 * lda, lda, K, panel + h * 32, bias ? bias + h * 16 : nullptr, y + r0 * ldy + h * 16, ldy,
                  cols);
    }
  }
#else
  tm_scalar::bf16_panel_rows(x, lda, M, K, panel, bias, y, ldy, ncols);
#endif
}
}  // namespace tm_avx2

namespace {

// x as contiguous bf16 rows. float32 rows are rounded here (vcvtneps2bf16) rather than by
// x.to(kBFloat16): at decode sizes ATen's conversion cost ~20 us a call, mostly dispatch
// (`python -m tokenmill.bench.profile`: 3.5% of a W1 run in bf16), for a few microseconds of work.
at::Tensor bf16_rows(const at::Tensor& x) {
  if (x.scalar_type() != at::kFloat) return x.to(at::kBFloat16).contiguous();
  const at::Tensor xf = x.contiguous();
  auto out = tokenmill_ops::new_tensor(xf.sizes(), xf.options().dtype(at::kBFloat16));
  const float* src = xf.data_ptr<float>();
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t n = xf.numel(), grain = 1 << 16;  // elements per task: small inputs stay on one thread
  at::parallel_for(0, (n + grain - 1) / grain, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      tm_avx512_bf16::round_to_bf16(src + i * grain, dst + i * grain, std::min(grain, n - i * grain));
  });
  return out;
}

// rows per pass over the weights: an x slice of ~384 KiB stays in L2 while a thread's panels stream past
inline int64_t chunk_rows(int64_t K) { return std::clamp<int64_t>((384 << 10) / (K * 4), 48, 1024); }

// Which two-panel kernels (gemm_pair_avx512.cpp) serve M rows: the dot-product ones with AVX512_BF16
// from three rows on (one or two stream the weights as fast widened, unrounded) outside batch-invariant
// mode; the widening ones at the avx512 level for every row count (its kernels are batch-invariant
// anyway) and with AVX512_BF16 for one or two rows; none at AVX2 and scalar, and in batch-invariant
// mode with AVX512_BF16. bf16_panel_linear takes the dot-product ones; the fused ops (SwiGLU, greedy
// argmax) take either, so they match the path bf16_panel_linear takes for the same rows, or fall back
// to the unfused ops.
enum class PairPath { kNone, kDot, kWiden };
inline PairPath pair_path(int64_t M) {
  const auto level = tokenmill_isa::active_level();
  if (level == tokenmill_isa::Level::kAvx512) return PairPath::kWiden;
  if (level != tokenmill_isa::Level::kAvx512Bf16 || tokenmill_isa::batch_invariant()) return PairPath::kNone;
  return M > 2 ? PairPath::kDot : PairPath::kWiden;
}

// x as the path's kernels read it: bf16 rows for the dot-product kernels, float32 rows for the widening ones
inline at::Tensor path_rows(const at::Tensor& x, bool dot) {
  return dot ? bf16_rows(x) : x.to(at::kFloat).contiguous();
}

void check_packed(const at::Tensor& packed, int64_t N, int64_t K) {
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.dim() == 4 && packed.size(2) == kBf16PanelCols &&
                  packed.size(3) == 2 && packed.is_contiguous(), "packed: [N/32, K/2, 32, 2] bfloat16");
  TORCH_CHECK(packed.size(1) == (K + 1) / 2 && packed.size(0) == (N + kBf16PanelCols - 1) / kBf16PanelCols,
              "packed does not hold [", N, ", ", K, "]");
}

}  // namespace

namespace tokenmill_ops {

// W [N, K] bf16 -> P[N/32][K2][32][2] bf16, zero-padded
at::Tensor pack_bf16_panels(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.dim() == 2, "weight: [N, K] bfloat16");
  auto w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), panels = (N + kBf16PanelCols - 1) / kBf16PanelCols, K2 = (K + 1) / 2;
  auto packed = w.new_zeros({panels, K2, kBf16PanelCols, 2});
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* dst = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pi = begin; pi < end; ++pi)
      for (int64_t j = 0; j < std::min(kBf16PanelCols, N - pi * kBf16PanelCols); ++j) {
        const uint16_t* row = src + (pi * kBf16PanelCols + j) * K;
        uint16_t* col = dst + pi * K2 * kBf16PanelPairStride + 2 * j;
        for (int64_t k = 0; k < K; ++k) col[(k / 2) * kBf16PanelPairStride + (k & 1)] = row[k];
      }
  });
  return packed;
}

at::Tensor bf16_panel_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                             const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "x: [M, K] float32 or bfloat16");
  const int64_t M = x.size(0), K = x.size(1);
  check_packed(packed, N, K);
  const int64_t panels = packed.size(0);
  auto y = new_tensor({M, N}, x.options().dtype(at::kFloat));
  at::Tensor bc;
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    bc = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(bc.numel() == N, "bias: [N]");
    b = bc.data_ptr<float>();
  }
  if (M == 0) return y;
  const auto level = tokenmill_isa::active_level();
  // one or two rows stream the weights at the same rate without rounding x (measured:
  // `python -m tokenmill.bench.kernels --only isa`), so they take the widening path, except in
  // batch-invariant mode: there every row count takes the dot-product path (x rounded to bf16)
  const bool dp = level == tokenmill_isa::Level::kAvx512Bf16 && (M > 2 || tokenmill_isa::batch_invariant());
  // the dot-product path reads bf16 rows; the widening paths float32 rows
  const at::Tensor xc = path_rows(x, dp);
  const auto* pp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  const int64_t panel_size = packed.size(1) * kBf16PanelPairStride;
  const int64_t kChunkRows = chunk_rows(K);
  // the two-panel kernels take adjacent panels two at a time (a 64-column block per pass over x);
  // batch-invariant mode keeps the one-panel kernels, one accumulation order for every row count
  const int64_t span = pair_path(M) == PairPath::kDot ? 2 : 1;
  auto run = [&](int64_t begin, int64_t end, int64_t r0, int64_t r1) {
    for (int64_t c0 = r0; c0 < r1; c0 += kChunkRows) {
      const int64_t rows = std::min(kChunkRows, r1 - c0);
      for (int64_t pi = begin * span; pi < std::min(end * span, panels); pi += span) {
        const int64_t n0 = pi * kBf16PanelCols, ncols = std::min(span * kBf16PanelCols, N - n0);
        const uint16_t* panel = pp + pi * panel_size;
        const float* bp = b ? b + n0 : nullptr;
        float* yb = yp + c0 * N + n0;
        if (dp) {
          const auto* xb = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()) + c0 * K;
          if (ncols > kBf16PanelCols)
            tm_avx512_bf16::bf16_panel_pair_rows(xb, K, rows, K, panel, panel + panel_size, bp, yb, N, ncols);
          else
            tm_avx512_bf16::bf16_panel_rows(xb, K, rows, K, panel, bp, yb, N, ncols);
        } else if (level >= tokenmill_isa::Level::kAvx512) {
          tm_avx512::bf16_panel_rows(xc.data_ptr<float>() + c0 * K, K, rows, K, panel, bp, yb, N, ncols);
        } else if (level == tokenmill_isa::Level::kAvx2) {
          tm_avx2::bf16_panel_rows(xc.data_ptr<float>() + c0 * K, K, rows, K, panel, bp, yb, N, ncols);
        } else {
          tm_scalar::bf16_panel_rows(xc.data_ptr<float>() + c0 * K, K, rows, K, panel, bp, yb, N, ncols);
        }
      }
    }
  };
  tokenmill_gemm::parallel_units_rows((panels + span - 1) / span, M, span == 2 ? 1 : 2, run);
  return y;
}

// silu(x Wg) * (x Wu) from gate_up panels packed as [Wg; Wu] (gate panels first, `inter` columns
// each, inter a multiple of 32): a gate panel and its up panel are multiplied together and silu(g) * u
// leaves the registers, with no [M, 2 * inter] float32 intermediate and no silu_and_mul pass. On the
// dot-product path (pair_path) the product leaves as bf16 rows, the input the down projection rounds
// to anyway (no rounding pass either); on the widening path as float32 rows, the sums of the unfused
// ops. Elsewhere the unfused ops, float32 out.
at::Tensor bf16_swiglu(const at::Tensor& x, const at::Tensor& packed, int64_t inter) {
  TORCH_CHECK(inter > 0 && inter % kBf16PanelCols == 0 && packed.dim() == 4 &&
                  packed.size(0) == 2 * inter / kBf16PanelCols, "bf16_swiglu: packed must hold [2 * ", inter,
              ", K] with ", inter, " a multiple of ", kBf16PanelCols);
  const PairPath path = x.dim() == 2 ? pair_path(x.size(0)) : PairPath::kNone;
  if (path == PairPath::kNone) return silu_and_mul(bf16_panel_linear(x, packed, 2 * inter, c10::nullopt));
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x: [M, K] float32 or bfloat16");
  const int64_t M = x.size(0), K = x.size(1);
  check_packed(packed, 2 * inter, K);
  const bool dot = path == PairPath::kDot;
  const at::Tensor xc = path_rows(x, dot);
  auto y = new_tensor({M, inter}, x.options().dtype(dot ? at::kBFloat16 : at::kFloat));
  // one of each pair is used: bf16 x and y on the dot-product path, float32 on the widening one
  const auto* xb = dot ? reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()) : nullptr;
  auto* yb = dot ? reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()) : nullptr;
  const float* xf = dot ? nullptr : xc.data_ptr<float>();
  float* yf = dot ? nullptr : y.data_ptr<float>();
  const auto* pp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const int64_t panel_size = packed.size(1) * kBf16PanelPairStride, pairs = inter / kBf16PanelCols;
  const int64_t kChunkRows = chunk_rows(K);
  tokenmill_gemm::parallel_units_rows(pairs, M, 1, [&](int64_t begin, int64_t end, int64_t r0, int64_t r1) {
    for (int64_t c0 = r0; c0 < r1; c0 += kChunkRows) {
      const int64_t rows = std::min(kChunkRows, r1 - c0);
      for (int64_t pi = begin; pi < end; ++pi) {
        const uint16_t* gate = pp + pi * panel_size;
        const uint16_t* up = pp + (pairs + pi) * panel_size;
        const int64_t y0 = c0 * inter + pi * kBf16PanelCols;
        if (dot)
          tm_avx512_bf16::bf16_swiglu_rows(xb + c0 * K, K, rows, K, gate, up, yb + y0, inter, kBf16PanelCols);
        else
          tm_avx512::bf16_swiglu_rows(xf + c0 * K, K, rows, K, gate, up, yf + y0, inter, kBf16PanelCols);
      }
    }
  });
  return y;
}

// argmax over the first n_valid columns of x W^T (greedy sampling from the LM head), first index on
// ties as torch.argmax. On the fused paths (pair_path) the logits never leave the registers: each
// thread folds its 64-column blocks into per-row, per-lane bests (the same sums as bf16_panel_linear
// for those rows, so the same values), merged at the end. Elsewhere bf16_panel_linear + argmax.
at::Tensor bf16_argmax_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t n_valid) {
  TORCH_CHECK(n_valid > 0 && n_valid <= N, "n_valid must be in [1, N]");
  const PairPath path = x.dim() == 2 ? pair_path(x.size(0)) : PairPath::kNone;
  if (path == PairPath::kNone) return bf16_panel_linear(x, packed, N, c10::nullopt).narrow(1, 0, n_valid).argmax(1);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x: [M, K] float32 or bfloat16");
  const int64_t M = x.size(0), K = x.size(1);
  check_packed(packed, N, K);
  const int64_t panels = packed.size(0);
  const bool dot = path == PairPath::kDot;
  const at::Tensor xc = path_rows(x, dot);
  const auto* xb = dot ? reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()) : nullptr;
  const float* xf = dot ? nullptr : xc.data_ptr<float>();
  const auto* pp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const int64_t panel_size = packed.size(1) * kBf16PanelPairStride, kChunkRows = chunk_rows(K);
  std::vector<float> best_v(M, -std::numeric_limits<float>::infinity());
  std::vector<int64_t> best_i(M, -1);
  std::mutex merge;
  tokenmill_gemm::parallel_units_rows((panels + 1) / 2, M, 1, [&](int64_t begin, int64_t end, int64_t r0, int64_t r1) {
    std::vector<float> lv(M * 16, -std::numeric_limits<float>::infinity());
    std::vector<int32_t> li(M * 16, -1);
    for (int64_t c0 = r0; c0 < r1; c0 += kChunkRows) {
      const int64_t rows = std::min(kChunkRows, r1 - c0);
      for (int64_t u = begin; u < end; ++u) {
        const uint16_t* p0 = pp + 2 * u * panel_size;
        // an odd last panel pairs with itself: its second copy's columns are past N, never valid
        const uint16_t* p1 = 2 * u + 1 < panels ? p0 + panel_size : p0;
        const int64_t n0 = 2 * u * kBf16PanelCols;
        if (dot)
          tm_avx512_bf16::bf16_panel_pair_argmax_rows(xb + c0 * K, K, rows, K, p0, p1, n0, n_valid,
                                                      lv.data() + 16 * c0, li.data() + 16 * c0);
        else
          tm_avx512::bf16_panel_pair_argmax_rows(xf + c0 * K, K, rows, K, p0, p1, n0, n_valid, lv.data() + 16 * c0,
                                                 li.data() + 16 * c0);
      }
    }
    std::lock_guard<std::mutex> lock(merge);
    for (int64_t r = r0; r < r1; ++r)
      for (int l = 0; l < 16; ++l) {
        const float v = lv[16 * r + l];
        const int64_t i = li[16 * r + l];
        if (i >= 0 && (best_i[r] < 0 || v > best_v[r] || (v == best_v[r] && i < best_i[r]))) {
          best_v[r] = v;
          best_i[r] = i;
        }
      }
  });
  auto out = new_tensor({M}, x.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < M; ++r) o[r] = std::max<int64_t>(best_i[r], 0);  // a row of NaNs: column 0
  return out;
}

}  // namespace tokenmill_ops
