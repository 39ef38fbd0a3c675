// The Cephes expf constants shared by the vectorized exp of every ISA (vec_math.h's exp256,
// decode_avx512.cpp's exp512): exp(x) = 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 split
// in two parts), p(r) = 1 + r + r^2 * poly(r). Plain constants: safe to include under any target.
#pragma once

namespace tm_exp {
constexpr float kClamp = 87.3f;  // |x| above this saturates (float's exponent range)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr int kPolyTerms = 6;
constexpr float kPoly[kPolyTerms] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace tm_exp
