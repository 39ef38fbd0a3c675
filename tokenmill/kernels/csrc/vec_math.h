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

// 2^x on 8 lanes (exp512.h's exp2_512 without vscalefps): 2^round(x) * q(f) with exp_poly.h's degree-6
// q. x is clamped to [-127, 127]: at -127 the exponent field is 0, so far-below values flush to +0.
inline __m256 exp2_256(__m256 x) {
  using namespace tm_exp;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-127.f)), _mm256_set1_ps(127.f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 q = _mm256_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < kExp2Terms; ++i) q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(kExp2Poly[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(q, _mm256_castsi256_ps(e));
}

// Lanes i < n of an 8-wide group starting at i0 (all ones where i0 + lane < n).
inline __m256 first_lanes_256(int64_t i0, int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i0)), lane));
}
#endif

// s[i] = 2^(s[i] - mx) for i < n, 0 for n <= i < width rounded up to 8 (the row must have room);
// returns the sum of the first n. Prefill attention's AVX2 softmax (scores in log2 units).
inline float exp2_sub_row(float* s, int64_t n, int64_t width, float mx) {
#ifdef __AVX2__
  const __m256 m = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < width; i += 8) {
    const __m256 keep = first_lanes_256(i, n);
    const __m256 e = _mm256_and_ps(keep, exp2_256(_mm256_sub_ps(_mm256_loadu_ps(s + i), m)));
    sum = _mm256_add_ps(sum, e);
    _mm256_storeu_ps(s + i, e);
  }
  return hsum(sum);
#else  // not x86-64-v3: plain loops
  float sum = 0.f;
  for (int64_t i = 0; i < (width + 7) / 8 * 8; ++i) {
    s[i] = i < n ? std::exp2(s[i] - mx) : 0.f;
    if (i < n) sum += s[i];
  }
  return sum;
#endif
}

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
