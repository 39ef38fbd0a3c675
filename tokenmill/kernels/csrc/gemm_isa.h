// Per-ISA GEMM row kernels behind one signature each; gemm_dispatch.cpp picks one per call by the
// active level (cpu_isa.h). No ATen here: the AVX-512 units include this under a target pragma.
//
// A bf16 panel holds 32 output columns as k-pairs: P[K2][32][2] (K2 = ceil(K/2), the pair (k, k+1)
// of one column in one 32-bit lane, zero-padded past K and past the last column), the operand
// layout of AVX512_BF16's vdpbf16ps. A float32 panel is P[K][16] (gemm_micro.h).
#pragma once

#include <cstdint>

namespace tokenmill_gemm {
constexpr int64_t kBf16PanelCols = 32;
constexpr int64_t kBf16PanelPairStride = 64;  // uint16 per k-pair row of a panel
}  // namespace tokenmill_gemm

// y[M, ncols] = x[M, K] . panel (+ bias), float32 out; x in bf16 bits (row stride lda).
namespace tm_avx512_bf16 {
void bf16_panel_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel,
                     const float* bias, float* y, int64_t ldy, int64_t ncols);
// y[M, ncols] += x . panel (prefill attention's O += P V in bf16)
void bf16_panel_rows_acc(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel, float* y,
                         int64_t ldy, int64_t ncols);
// y[M, ncols <= 64] = x . [panel0 | panel1] (+ bias): two panels per pass over x (not batch-invariant)
void bf16_panel_pair_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel0,
                          const uint16_t* panel1, const float* bias, float* y, int64_t ldy, int64_t ncols);
// Each row's running argmax over the columns n0 .. n0 + 63 (< n_valid) of x . [panel0 | panel1]:
// best_v / best_i [M][16] per lane (column mod 16), updated where a value is strictly greater.
void bf16_panel_pair_argmax_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel0,
                                 const uint16_t* panel1, int64_t n0, int64_t n_valid, float* best_v,
                                 int32_t* best_i);
// y[M, ncols] (bf16) = silu(x . gate_panel) * (x . up_panel), rounded to nearest even (SwiGLU)
void bf16_swiglu_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t K, const uint16_t* gate_panel,
                      const uint16_t* up_panel, uint16_t* y, int64_t ldy, int64_t ncols);
// y[0:n] = x[0:n] rounded to bf16 (nearest even; vcvtneps2bf16)
void round_to_bf16(const float* x, uint16_t* y, int64_t n);
// p[0:n] = 2^(s[0:n] - mx) rounded to bf16 (s <= mx + 8: scores in log2 units, mx a running max that may
// lag), p[n:width] = 0; returns the sum of the unrounded values (prefill attention's softmax numerators,
// one pass instead of exp, store, fill and round; relative error of the exp 5.7e-6)
float exp2_round_row(const float* s, int64_t n, int64_t width, float mx, uint16_t* p);
}  // namespace tm_avx512_bf16

// The same from float32 x: bf16 weights widened in registers (AVX-512F, AVX2) or scalar.
namespace tm_avx512 {
void bf16_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel, const float* bias,
                     float* y, int64_t ldy, int64_t ncols);
// the fused pair kernels of tm_avx512_bf16 from float32 x, the SwiGLU product in float32 (the same sums
// as bf16_panel_rows: the fused ops give the unfused ones' values up to the silu's exp)
void bf16_panel_pair_argmax_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel0,
                                 const uint16_t* panel1, int64_t n0, int64_t n_valid, float* best_v,
                                 int32_t* best_i);
void bf16_swiglu_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* gate_panel,
                      const uint16_t* up_panel, float* y, int64_t ldy, int64_t ncols);
// float32 panels P[K][16]: y[M, ncols] = x . panel (+ bias)
void f32_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const float* panel, const float* bias,
                    float* y, int64_t ldy, int64_t ncols);
// y[M, ncols <= 32] = x . [panel0 | panel1] (+ bias): two float32 panels per pass over x (not batch-invariant)
void f32_panel_pair_rows(const float* x, int64_t lda, int64_t M, int64_t K, const float* panel0,
                         const float* panel1, const float* bias, float* y, int64_t ldy, int64_t ncols);
// y[M, ncols] = x . panels (acc: +=), panel j's [K][16] at panel + j * pstride: adjacent panels two at a
// time (MR x 32 blocks, MR <= 12), an odd last one alone; every sum runs over k in order in one
// accumulator, so the result depends on neither M's blocking nor the pairing (prefill attention)
void f32_panels_rows(const float* x, int64_t lda, int64_t M, int64_t K, const float* panel, int64_t pstride,
                     float* y, int64_t ldy, int64_t ncols, bool acc);
// s[j] = 2^(s[j] - mx) for j < n, 0 for n <= j < width; returns the sum of the first n (exp512.h's exp2_512)
float exp2_sub_row(float* s, int64_t n, int64_t width, float mx);
}  // namespace tm_avx512
namespace tm_avx2 {
void bf16_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel, const float* bias,
                     float* y, int64_t ldy, int64_t ncols);
}  // namespace tm_avx2
namespace tm_scalar {
void bf16_panel_rows(const float* x, int64_t lda, int64_t M, int64_t K, const uint16_t* panel, const float* bias,
                     float* y, int64_t ldy, int64_t ncols);
}  // namespace tm_scalar
