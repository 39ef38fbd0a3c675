// The AVX-512 decode attention (decode_avx512.cpp) behind a plain signature, called by
// paged_decode.cpp when the active level (cpu_isa.h) has AVX-512. No ATen here: the AVX-512 unit
// includes this under a target pragma.
#pragma once

#include <cstdint>

namespace tm_avx512 {

// Decode attention of one sequence for KV heads [h0, h1) and their G query heads each, from a
// plain float32 or bf16 cache ([slots, Hkv, D]; `bf16` says which): q [H, D] and out [H, D]
// float32 (only the task's heads are written). slots[t] is the cache row of visible token t.
// lse, when not null ([H]), receives each written query head's log-sum-exp of its scaled scores (the
// softmax's log denominator, natural log): what joins the outputs of a context split into pieces.
// scratch holds at least decode_scratch_floats(G, len, D, h1 - h0) floats.
// Returns false, touching nothing, when this shape has no AVX-512 path (D % 32 != 0, D > 128,
// or G not in {1, 2, 3, 4, 6, 8}).
bool decode_heads(const float* q, const void* k, const void* v, bool bf16, const int64_t* slots, int64_t len,
                  float* out, float* lse, int64_t G, int64_t Hkv, int64_t h0, int64_t h1, int64_t D, float scale,
                  float* scratch);
int64_t decode_scratch_floats(int64_t G, int64_t len, int64_t D, int64_t heads);

// vec_math.h's row_max and exp_sub_sum on 16 lanes with masked tails (no scalar libm tail); the
// prefill attention's softmax uses them too.
float row_max(const float* s, int64_t n);
float exp_sub_sum(float* s, int64_t n, float mx);

}  // namespace tm_avx512
