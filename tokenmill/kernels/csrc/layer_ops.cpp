// Fused float32 elementwise ops of a decoder layer: each replaces 4-10 small PyTorch ops (and their
// dispatch and temporaries) with one pass over the rows. Built with paged_decode.cpp by cpu_ops.py.
//
//   fused_add_rms_norm(x, residual, weight, eps): residual += x; x = rms_norm(residual) * weight
//   rms_norm(x, weight, eps) -> y
//   silu_and_mul(gu [T, 2I]) -> silu(gu[:, :I]) * gu[:, I:]
//   rotary_(x [T, H, D] strided rows, cos [T, D], sin [T, D]): rotate-half RoPE in place
#include <ATen/Parallel.h>

#include <cmath>

#include "ops.h"
#include "vec_math.h"

namespace {

inline void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 2 && t.stride(1) == 1, name,
              ": float32 [T, N] with contiguous rows");
}

inline void norm_row(const float* in, const float* w, float* out, int64_t n, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i) ss += in[i] * in[i];
  const float r = 1.f / std::sqrt(ss / n + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (in[i] * r);
}

}  // namespace

namespace tokenmill_ops {

void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  check_rows(residual, "residual");
  TORCH_CHECK(x.sizes() == residual.sizes() && weight.is_contiguous() && weight.numel() == x.size(1),
              "shapes do not match");
  const int64_t n = x.size(1);
  const float* w = weight.data_ptr<float>();
  float* xp = x.data_ptr<float>();
  float* rp = residual.data_ptr<float>();
  const int64_t xs = x.stride(0), rs = residual.stride(0);
  at::parallel_for(0, x.size(0), 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* xr = xp + t * xs;
      float* rr = rp + t * rs;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) rr[i] += xr[i];
      norm_row(rr, w, xr, n, static_cast<float>(eps));
    }
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1), "weight does not match x");
  auto out = new_tensor({x.size(0), x.size(1)}, x.options());
  const int64_t n = x.size(1), xs = x.stride(0);
  const float* xp = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) norm_row(xp + t * xs, w, op + t * n, n, static_cast<float>(eps));
  });
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& gu) {
  check_rows(gu, "gate_up");
  const int64_t inter = gu.size(1) / 2, gs = gu.stride(0);
  auto out = new_tensor({gu.size(0), inter}, gu.options());
  const float* g = gu.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, gu.size(0), 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* gr = g + t * gs;
      const float* ur = gr + inter;
      float* orow = o + t * inter;
      int64_t i = 0;
#ifdef __AVX2__
      const __m256 one = _mm256_set1_ps(1.f);
      for (; i + 8 <= inter; i += 8) {
        const __m256 gv = _mm256_loadu_ps(gr + i);
        const __m256 den = _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
        _mm256_storeu_ps(orow + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(ur + i)));
      }
#endif
      for (; i < inter; ++i) orow[i] = gr[i] / (1.f + std::exp(-gr[i])) * ur[i];
    }
  });
  return out;
}

void rotary_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 3 && x.stride(2) == 1, "x: float32 [T, H, D]");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 && cos.size(0) == x.size(0) &&
                  cos.size(1) == x.size(2),
              "cos/sin: contiguous [T, D]");
  const int64_t H = x.size(1), D = x.size(2), half = D / 2;
  const int64_t ts = x.stride(0), hs = x.stride(1);
  float* xp = x.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* ct = c + t * D;
      const float* st = s + t * D;
      for (int64_t h = 0; h < H; ++h) {
        float* r = xp + t * ts + h * hs;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = r[i], x2 = r[i + half];
          r[i] = x1 * ct[i] - x2 * st[i];
          r[i + half] = x2 * ct[i + half] + x1 * st[i + half];
        }
      }
    }
  });
}

}  // namespace tokenmill_ops
