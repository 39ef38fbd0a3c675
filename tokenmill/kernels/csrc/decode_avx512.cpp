// AVX-512 decode attention (decode_isa.h), float32 math over a plain float32 or bf16 cache. This
// unit is compiled for AVX-512 by the target pragma below whatever the build's baseline, and only
// called when the running CPU has it (paged_decode.cpp). Standard headers come before the pragma.
//
// The AVX2 kernel spends most of its time outside the multiply-adds (widening bf16 lane by lane,
// one horizontal sum per score, 16 registers). Here:
// - a cache row's 32 bf16 values widen with one load, a shift and a mask: the shift gives the even
//   columns as float32, the mask the odd ones; q is permuted the same way once per sequence (and
//   pre-scaled), the output un-permuted at the end, so no lane shuffles in the loops;
// - scores come 16 tokens at a time: one zmm of partial sums per (token, query head), then one
//   transpose-reduce turns 16 of them into 16 scores (45 shuffles and adds instead of 16 x 8);
// - both passes walk tiles of 16 tokens with the KV heads inside, so a tile's rows (all heads
//   contiguous) are read from memory once; while a tile's head h is worked on, the same head's pieces
//   of the rows two tiles ahead are prefetched into L2, one or two rows per token processed. Spread
//   out like this, not as a burst of a whole tile's rows at the tile's start (96 prefetches for 9/3
//   heads, D 64, bf16), the kernel read its K/V from DRAM 1.27x faster on an Emerald Rapids VM and ran
//   1.15x faster in cache (docs/BENCHMARKS.md, machine D, session 30).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "decode_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx512_intrinsics.h"

TM_AVX512_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#include "exp512.h"

namespace tm_avx512_decode {

constexpr int64_t TB = 16;  // tokens per tile: one zmm of scores per query head

// 32 values of a row at its column c (the pointer) as two float32 vectors: bf16 -> (even columns,
// odd columns); float32 -> (c..c+15, c+16..c+31).
inline void load32(const uint16_t* row, __m512& a, __m512& b) {
  const __m512i w = _mm512_loadu_si512(row);
  a = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  b = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline void load32(const float* row, __m512& a, __m512& b) {
  a = _mm512_loadu_ps(row);
  b = _mm512_loadu_ps(row + 16);
}

// The column held by lane i of vector half (0 = a, 1 = b) of a 32-column piece.
template <typename T>
constexpr int64_t column(int half, int64_t i) {
  if constexpr (sizeof(T) == 2) return 2 * i + half;
  else return 16 * half + i;
}

inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// Two tokens' partial-sum vectors folded into one: lanes of x and y interleaved in pairs, each lane
// the sum of two lanes of the same vector (the first step of a transpose-reduce).
inline __m512 fold2(__m512 x, __m512 y) { return _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y)); }

// The rest of the transpose-reduce: b holds fold2 of tokens (0, 1), (2, 3), ..., (14, 15); returns
// the 16 tokens' full sums in order (each add combines lanes of one token only).
inline __m512 reduce_folded(const float* b) {
  __m512 c[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(_mm512_loadu_ps(b + 32 * i)), y = _mm512_castps_pd(_mm512_loadu_ps(b + 32 * i + 16));
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
  const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

using tm_avx512_math::exp512;

// s[0:n] = exp(s - max(s)) in place; returns 1 / their sum, and the max in *max_out.
inline float softmax_numerators(float* s, int64_t n, float* max_out) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16)
    m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, first_lanes(n - i), s + i));
  *max_out = _mm512_reduce_max_ps(m);
  const __m512 mx = _mm512_set1_ps(*max_out);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = first_lanes(n - i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), mx));
    _mm512_mask_storeu_ps(s + i, k, e);
    sum = _mm512_mask_add_ps(sum, k, sum, e);
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

// One KV head's piece of a cache row (D values) into L2.
template <int64_t D, typename T>
inline void prefetch_piece(const T* p) {
  const char* c = reinterpret_cast<const char*>(p);
#pragma GCC unroll 8
  for (int64_t off = 0; off < D * int64_t(sizeof(T)); off += 64) _mm_prefetch(c + off, _MM_HINT_T1);
}

// Whole rows (all heads) of n tokens into L2: a sequence's first two tiles.
template <typename T>
inline void prefetch_rows(const T* base, const int64_t* slots, int64_t n, int64_t row_elems) {
  const int64_t bytes = row_elems * int64_t(sizeof(T));
  for (int64_t i = 0; i < n; ++i) {
    const char* p = reinterpret_cast<const char*>(base + slots[i] * row_elems);
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
  }
}

// Raw scores of one tile (n <= 16 tokens) against KV head h for its G query heads: qp is the heads'
// permuted, pre-scaled q ([G][2 ND][16]), held in registers over the tile; tokens go in pairs, whose
// partial sums are folded before they are stored; s[g * ld + i] receives token i's score of head g.
// ahead[0:n_ahead]: the slots of a later tile, whose head-h pieces are prefetched on the way.
template <int G, int ND, typename T>
inline void score_tile(const float* qp, const T* k, const int64_t* slots, int64_t n, int64_t Hkv, int64_t h,
                       float* s, int64_t ld, float* buf, const int64_t* ahead, int64_t n_ahead) {
  constexpr int64_t D = 32 * ND;
  __m512 qv[G * 2 * ND];
#pragma GCC unroll 16
  for (int u = 0; u < G * 2 * ND; ++u) qv[u] = _mm512_loadu_ps(qp + 16 * u);
  for (int64_t i = 0; i < n; i += 2) {
    const T* r0 = k + (slots[i] * Hkv + h) * D;
    const T* r1 = i + 1 < n ? k + (slots[i + 1] * Hkv + h) * D : r0;  // a lone last token: lanes unused
    if (i < n_ahead) prefetch_piece<D>(k + (ahead[i] * Hkv + h) * D);
    if (i + 1 < n_ahead) prefetch_piece<D>(k + (ahead[i + 1] * Hkv + h) * D);
    __m512 x0[2 * ND], x1[2 * ND];
#pragma GCC unroll 4
    for (int j = 0; j < ND; ++j) {
      load32(r0 + 32 * j, x0[2 * j], x0[2 * j + 1]);
      load32(r1 + 32 * j, x1[2 * j], x1[2 * j + 1]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512* qg = qv + g * 2 * ND;
      __m512 a0 = _mm512_mul_ps(qg[0], x0[0]), a1 = _mm512_mul_ps(qg[0], x1[0]);
#pragma GCC unroll 8
      for (int u = 1; u < 2 * ND; ++u) {
        a0 = _mm512_fmadd_ps(qg[u], x0[u], a0);
        a1 = _mm512_fmadd_ps(qg[u], x1[u], a1);
      }
      _mm512_storeu_ps(buf + (g * TB + i) * 8, fold2(a0, a1));
    }
  }
  const __mmask16 m = first_lanes(n);
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) _mm512_mask_storeu_ps(s + g * ld, m, reduce_folded(buf + g * TB * 8));
}

// o[g] += sum over the tile's tokens i of p[g * ld + i] * v_i (rows of KV head h), o permuted as qp;
// prefetches as score_tile.
template <int G, int ND, typename T>
inline void value_tile(const float* p, int64_t ld, const T* v, const int64_t* slots, int64_t n, int64_t Hkv,
                       int64_t h, float* o, const int64_t* ahead, int64_t n_ahead) {
  constexpr int64_t D = 32 * ND;
  __m512 acc[G * 2 * ND];
#pragma GCC unroll 16
  for (int u = 0; u < G * 2 * ND; ++u) acc[u] = _mm512_loadu_ps(o + 16 * u);
  for (int64_t i = 0; i < n; ++i) {
    const T* row = v + (slots[i] * Hkv + h) * D;
    if (i < n_ahead) prefetch_piece<D>(v + (ahead[i] * Hkv + h) * D);
    __m512 x[2 * ND];
#pragma GCC unroll 4
    for (int j = 0; j < ND; ++j) load32(row + 32 * j, x[2 * j], x[2 * j + 1]);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * ld + i]);
#pragma GCC unroll 8
      for (int u = 0; u < 2 * ND; ++u) acc[g * 2 * ND + u] = _mm512_fmadd_ps(w, x[u], acc[g * 2 * ND + u]);
    }
  }
#pragma GCC unroll 16
  for (int u = 0; u < G * 2 * ND; ++u) _mm512_storeu_ps(o + 16 * u, acc[u]);
}

template <int G, int ND, typename T>
void decode_seq(const float* q, const T* k, const T* v, const int64_t* slots, int64_t len, float* out, float* lse,
                int64_t Hkv, int64_t h0, int64_t h1, float scale, float* scratch) {
  constexpr int64_t D = 32 * ND, per_head = G * D;  // floats of q (or o) per KV head
  const int64_t nh = h1 - h0, row = Hkv * D;
  float* qp = scratch;           // [nh][G][2 ND][16], permuted, scaled
  float* o = qp + nh * per_head;  // [nh][G][2 ND][16], permuted
  float* buf = o + nh * per_head;  // [G][8][16] used: a tile's token pairs, folded (score_tile)
  float* s = buf + G * TB * 16;   // [nh][G][len]
  for (int64_t r = 0; r < nh * G; ++r) {
    const float* qr = q + (h0 * G + r) * D;
    for (int64_t j = 0; j < ND; ++j)
      for (int half = 0; half < 2; ++half)
        for (int64_t i = 0; i < 16; ++i)
          qp[r * D + (2 * j + half) * 16 + i] = qr[32 * j + column<T>(half, i)] * scale;
  }
  std::fill(o, o + nh * per_head, 0.f);
  for (int64_t t0 = 0; t0 < len; t0 += TB) {
    const int64_t n = std::min(TB, len - t0);
    if (t0 == 0) prefetch_rows(k, slots, std::min(2 * TB, len), row);
    const int64_t a = std::min(len, t0 + 2 * TB), na = std::min(TB, len - a);
    for (int64_t h = h0; h < h1; ++h)
      score_tile<G, ND>(qp + (h - h0) * per_head, k, slots + t0, n, Hkv, h, s + (h - h0) * G * len + t0, len, buf,
                        slots + a, na);
  }
  float inv[8 * 128];  // 1 / softmax denominators, one per query head (G <= 8, Hkv <= 128 on this path)
  for (int64_t r = 0; r < nh * G; ++r) {
    float mx;
    inv[r] = softmax_numerators(s + r * len, len, &mx);
    if (lse != nullptr) lse[h0 * G + r] = mx - std::log(inv[r]);
  }
  for (int64_t t0 = 0; t0 < len; t0 += TB) {
    const int64_t n = std::min(TB, len - t0);
    if (t0 == 0) prefetch_rows(v, slots, std::min(2 * TB, len), row);
    const int64_t a = std::min(len, t0 + 2 * TB), na = std::min(TB, len - a);
    for (int64_t h = h0; h < h1; ++h)
      value_tile<G, ND>(s + (h - h0) * G * len + t0, len, v, slots + t0, n, Hkv, h, o + (h - h0) * per_head,
                        slots + a, na);
  }
  for (int64_t r = 0; r < nh * G; ++r) {
    float* outr = out + (h0 * G + r) * D;
    for (int64_t j = 0; j < ND; ++j)
      for (int half = 0; half < 2; ++half)
        for (int64_t i = 0; i < 16; ++i)
          outr[32 * j + column<T>(half, i)] = o[r * D + (2 * j + half) * 16 + i] * inv[r];
  }
}

template <typename T>
bool dispatch(const float* q, const T* k, const T* v, const int64_t* slots, int64_t len, float* out, float* lse,
              int64_t G, int64_t Hkv, int64_t h0, int64_t h1, int64_t D, float scale, float* scratch) {
#define TM_CASE(g, nd)                                                                          \
  if (G == g && D == 32 * nd) {                                                                 \
    decode_seq<g, nd>(q, k, v, slots, len, out, lse, Hkv, h0, h1, scale, scratch);                  \
    return true;                                                                                \
  }
#define TM_G(g) TM_CASE(g, 1) TM_CASE(g, 2) TM_CASE(g, 3) TM_CASE(g, 4)
  TM_G(1) TM_G(2) TM_G(3) TM_G(4) TM_G(6) TM_G(8)
#undef TM_G
#undef TM_CASE
  return false;
}

}  // namespace tm_avx512_decode

namespace tm_avx512 {

float row_max(const float* s, int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16)
    m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, tm_avx512_decode::first_lanes(n - i), s + i));
  return _mm512_reduce_max_ps(m);
}

float exp_sub_sum(float* s, int64_t n, float mx) {
  const __m512 m = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tm_avx512_decode::first_lanes(n - i);
    const __m512 e = tm_avx512_decode::exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), m));
    _mm512_mask_storeu_ps(s + i, k, e);
    sum = _mm512_mask_add_ps(sum, k, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

int64_t decode_scratch_floats(int64_t G, int64_t len, int64_t D, int64_t heads) {
  return 2 * heads * G * D + G * tm_avx512_decode::TB * 16 + heads * G * len;
}

bool decode_heads(const float* q, const void* k, const void* v, bool bf16, const int64_t* slots, int64_t len,
                  float* out, float* lse, int64_t G, int64_t Hkv, int64_t h0, int64_t h1, int64_t D, float scale,
                  float* scratch) {
  if (len <= 0 || Hkv > 128) return false;
  if (bf16)
    return tm_avx512_decode::dispatch(q, static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v), slots,
                                      len, out, lse, G, Hkv, h0, h1, D, scale, scratch);
  return tm_avx512_decode::dispatch(q, static_cast<const float*>(k), static_cast<const float*>(v), slots, len, out,
                                    lse, G, Hkv, h0, h1, D, scale, scratch);
}

}  // namespace tm_avx512

TM_AVX512_END

#else  // not x86-64 GCC/Clang: no AVX-512 path

namespace tm_avx512 {
float row_max(const float*, int64_t) { std::abort(); }
float exp_sub_sum(float*, int64_t, float) { std::abort(); }
int64_t decode_scratch_floats(int64_t, int64_t, int64_t, int64_t) { return 0; }
bool decode_heads(const float*, const void*, const void*, bool, const int64_t*, int64_t, float*, float*, int64_t,
                  int64_t, int64_t, int64_t, int64_t, float, float*) {
  return false;
}
}  // namespace tm_avx512

#endif
