// The intrinsics of the AVX-512 units (gemm_avx512.cpp, decode_avx512.cpp, quant_avx512.cpp), included
// after their standard headers.
// - Normal builds: <immintrin.h>; TM_AVX512_BEGIN("features") opens the unit's target pragma and
//   TM_AVX512_END closes it, so the unit compiles for AVX-512 whatever the build's baseline.
// - TM_EMULATE_AVX512 (a test build, cpu_ops.py with TOKENMILL_EMULATE_AVX512=1): SIMDe's portable
//   versions of the same intrinsics under their usual names and no target pragma, so the kernels' own
//   logic (masks, tails, panel layouts, dispatch) runs and is tested on a CPU without AVX-512. It
//   checks neither the instructions' encodings nor speed (emulation is several times slower).
#pragma once

#if defined(TM_EMULATE_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cstdint>
#include <cstring>

// Two intrinsics SIMDe 0.8 lacks, with the instructions' semantics (own names: <immintrin.h>
// declares the real ones).
inline float tm_emu_reduce_add_ps(__m512 v) {
  float lanes[16];
  _mm512_storeu_ps(lanes, v);
  float s = 0.f;
  for (float x : lanes) s += x;
  return s;
}

// vcvtneps2bf16: round to nearest even; denormal inputs become zero (the instruction's DAZ); NaN stays
// a quiet NaN.
inline __m256bh tm_emu_cvtneps_pbh(__m512 v) {
  uint32_t bits[16];
  uint16_t out[16];
  _mm512_storeu_ps(reinterpret_cast<float*>(bits), v);
  for (int i = 0; i < 16; ++i) {
    const uint32_t b = bits[i];
    if ((b & 0x7F800000u) == 0) out[i] = static_cast<uint16_t>((b >> 16) & 0x8000u);
    else if ((b & 0x7FFFFFFFu) > 0x7F800000u) out[i] = static_cast<uint16_t>((b >> 16) | 0x40u);
    else out[i] = static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
  }
  __m256bh r;
  std::memcpy(&r, out, sizeof(r));
  return r;
}
#define _mm512_reduce_add_ps tm_emu_reduce_add_ps
#define _mm512_cvtneps_pbh tm_emu_cvtneps_pbh

// Masked loads and stores lane by lane: SIMDe 0.8's read or write all 64 bytes (its masked store writes
// zeros into the masked-off lanes), which overruns the row ends that the real instructions protect.
inline __m512 tm_emu_mask_loadu_ps(__m512 src, __mmask16 k, const void* p) {
  float lanes[16];
  _mm512_storeu_ps(lanes, src);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(&lanes[i], static_cast<const float*>(p) + i, sizeof(float));
  return _mm512_loadu_ps(lanes);
}
inline __m512 tm_emu_maskz_loadu_ps(__mmask16 k, const void* p) { return tm_emu_mask_loadu_ps(_mm512_setzero_ps(), k, p); }
inline void tm_emu_mask_storeu_ps(void* p, __mmask16 k, __m512 a) {
  float lanes[16];
  _mm512_storeu_ps(lanes, a);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(static_cast<float*>(p) + i, &lanes[i], sizeof(float));
}
inline void tm_emu_mask_storeu_epi16(void* p, __mmask16 k, __m256i a) {
  uint16_t lanes[16];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), a);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(static_cast<uint16_t*>(p) + i, &lanes[i], sizeof(uint16_t));
}
#undef _mm512_mask_loadu_ps
#undef _mm512_maskz_loadu_ps
#undef _mm512_mask_storeu_ps
#undef _mm256_mask_storeu_epi16
#define _mm512_mask_loadu_ps tm_emu_mask_loadu_ps
#define _mm512_maskz_loadu_ps tm_emu_maskz_loadu_ps
#define _mm512_mask_storeu_ps tm_emu_mask_storeu_ps
#define _mm256_mask_storeu_epi16 tm_emu_mask_storeu_epi16

#define TM_AVX512_BEGIN(features)
#define TM_AVX512_END
#else
#include <immintrin.h>

#define TM_AVX512_PRAGMA(x) _Pragma(#x)
#define TM_AVX512_BEGIN(features) TM_AVX512_PRAGMA(GCC push_options) TM_AVX512_PRAGMA(GCC target(features))
#define TM_AVX512_END TM_AVX512_PRAGMA(GCC pop_options)
#endif
