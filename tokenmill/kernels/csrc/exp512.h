// expf on 16 lanes: vec_math.h's exp256 (the constants of exp_poly.h), 512 bits wide. Include only
// inside an AVX-512 unit's target region (after TM_AVX512_BEGIN): it uses AVX-512 intrinsics.
#pragma once

#include "exp_poly.h"

namespace tm_avx512_math {
inline __m512 exp512(__m512 x) {
  using namespace tm_exp;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-kClamp)), _mm512_set1_ps(kClamp));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  __m512 y = _mm512_set1_ps(kPoly[0]);
  for (int i = 1; i < kPolyTerms; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kPoly[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

// 2^x for x <= 8 (attention scores minus their running max, in log2 units): 2^round(x) * q(f), f = x -
// round(x) in [-0.5, 0.5], q exp_poly.h's degree-6 fit of 2^f (max relative
// error 9.7e-8); 9 vector ops against exp512's 17. vscalefps flushes x far below the range to 0.
inline __m512 exp2_512(__m512 x) {
  using namespace tm_exp;
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 q = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < kExp2Terms; ++i) q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(kExp2Poly[i]));
  return _mm512_scalef_ps(q, n);
}
}  // namespace tm_avx512_math
