// The Cephes expf constants shared by the vectorized exp of every ISA (vec_math.h's exp256,
// decode_avx512.cpp's exp512): exp(x) = 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 split
// in two parts), p(r) = 1 + r + r^2 * poly(r). Then the 2^x of prefill attention's base-2 softmax
// (vec_math.h's exp2_256, exp512.h's exp2_512). Plain constants: safe to include under any target.
#pragma once

namespace tm_exp {
constexpr float kClamp = 87.3f;  // |x| above this saturates (float's exponent range)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr int kPolyTerms = 6;
constexpr float kPoly[kPolyTerms] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
// 2^f for f in [-0.5, 0.5], degree 6, highest power first (Horner): max relative error 9.7e-8 in
// float32, float's own rounding
constexpr int kExp2Terms = 7;
constexpr float kExp2Poly[kExp2Terms] = {1.535336341476068e-4f, 1.3398875016719103e-3f, 9.61843691766262e-3f,
                                         5.5503323674201965e-2f, 0.24022647738456726f, 0.6931471824645996f, 1.f};
}  // namespace tm_exp
