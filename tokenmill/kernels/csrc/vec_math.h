// Small AVX2 helpers shared by our CPU kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "exp_poly.h"

#ifdef __AVX2__
#include <immintrin.h>

inline float hsum(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// expf on 8 lanes, Cephes polynomial (~2 ulp), no libm call; saturates to 0 / 2^128 outside +-87.
inline __m256 exp256(__m256 x) {
  using namespace tm_exp;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-kClamp)), _mm256_set1_ps(kClamp));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  __m256 y = _mm256_set1_ps(kPoly[0]);
  for (int i = 1; i < kPolyTerms; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kPoly[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

// exp(s[i] - mx) in place for i < n (vectorized where AVX2 is there); returns their sum.
inline float exp_sub_sum(float* s, int64_t n, float mx) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef __AVX2__
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = hsum(acc);
#endif
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - mx);
    sum += s[i];
  }
  return sum;
}

// max of s[0:n] (-inf when n == 0)
inline float row_max(const float* s, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
#ifdef __AVX2__
  if (n >= 8) {
    __m256 m = _mm256_loadu_ps(s);
    for (j = 8; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
    alignas(32) float t[8];
    _mm256_store_ps(t, m);
    for (float x : t) mx = std::max(mx, x);
  }
#endif
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  return mx;
}
