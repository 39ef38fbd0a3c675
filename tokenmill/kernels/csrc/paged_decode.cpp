// Paged decode attention on CPU: one query token per sequence, K/V read in place from the paged
// cache (no gathered copy). Built at first use by tokenmill/kernels/cpu_ops.py.
//
// Shapes: q [B, H, D] float32; k_cache, v_cache [num_slots, Hkv, D] in float32, bfloat16, int8 or
// float8_e4m3fn; k_scale, v_scale [num_slots, Hkv] (int8 log8 codes: scale = 2^(code/8), or
// float32) or empty for a plain cache; block_tables [B, max_blocks] int64; seq_lens [B] int64.
// window > 0: each query sees only the last `window` tokens of its context (sliding-window
// attention, Mistral's convention: key j is visible to the query at position i iff i - j < window).
// Output [B, H, D] float32. One task per (sequence, KV head) serves its GQA group of H/Hkv query
// heads, so every K/V row is read once per step. Two passes: scores, then softmax-weighted V.
#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>

#include "cpu_isa.h"
#include "decode_isa.h"
#include "decode_plan.h"
#include "ops.h"
#include "vec_math.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using tokenmill_decode::DecodeJoin;
using tokenmill_decode::DecodePlan;
using tokenmill_decode::DecodeTask;

template <typename T>
inline float to_float(T x) { return static_cast<float>(x); }

// e4m3 -> float through a 256-entry table: c10's bit-twiddling conversion does not vectorize.
struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i) v[i] = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(i), c10::Float8_e4m3fn::from_bits()));
  }
};
static const E4m3Table kE4m3;

template <>
inline float to_float(c10::Float8_e4m3fn x) { return kE4m3.v[x.x]; }

// log8 scale codes -> scales, 2^(code/8), by table (one exp2 per row was a third of the int8 kernel).
struct Log8Table {
  float v[256];
  Log8Table() {
    for (int i = 0; i < 256; ++i) v[i] = std::exp2(static_cast<int8_t>(static_cast<uint8_t>(i)) / 8.0f);
  }
};
static const Log8Table kLog8;

inline float scale_of(const void* scales, bool log8, int64_t index) {
  if (scales == nullptr) return 1.0f;
  if (log8) return kLog8.v[static_cast<const uint8_t*>(scales)[index]];
  return static_cast<const float*>(scales)[index];
}

#ifdef __AVX2__
// 8 values of the cache's storage type -> 8 floats
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 load8(const c10::Float8_e4m3fn* p) {
  const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_i32gather_ps(kE4m3.v, idx, 4);
}

// Prefetch distance in rows (tokens), into L2: on Zen 4 (machine B) an L2 hint reads K/V from DRAM at
// 1.4-1.6x the rate of an L1 hint (docs/BENCHMARKS.md, "Decode attention on AVX-512 ...").
constexpr int64_t PF = 16;

template <typename T>
inline void prefetch_row(const T* p, int64_t D) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < D * int64_t(sizeof(T)); off += 64) _mm_prefetch(c + off, _MM_HINT_T1);
}

// Four horizontal sums at once: [sum(a), sum(b), sum(c), sum(d)] (4 shuffles instead of 4 x 5).
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Scores of G query heads against two K rows at once (2G independent FMA chains hide latency);
// s[g * ld] and s[g * ld + 1] receive row 0's and row 1's score of head g.
template <int G, typename T>
inline void scores2(const float* q, const T* k0, const T* k1, int64_t D, float* s, int64_t ld) {
  __m256 a[2 * G + 2];
#pragma GCC unroll 16
  for (int i = 0; i < 2 * G + 2; ++i) a[i] = _mm256_setzero_ps();
  for (int64_t c = 0; c < D; c += 8) {
    const __m256 x0 = load8(k0 + c), x1 = load8(k1 + c);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m256 qv = _mm256_loadu_ps(q + g * D + c);
      a[2 * g] = _mm256_fmadd_ps(qv, x0, a[2 * g]);
      a[2 * g + 1] = _mm256_fmadd_ps(qv, x1, a[2 * g + 1]);
    }
  }
  alignas(16) float sums[2 * G + 2];
#pragma GCC unroll 8
  for (int i = 0; i < 2 * G; i += 4) _mm_store_ps(sums + i, hsum4(a[i], a[i + 1], a[i + 2], a[i + 3]));
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    s[g * ld] = sums[2 * g];
    s[g * ld + 1] = sums[2 * g + 1];
  }
}

// o[g, c:c+8W] += sum over rows r of p[g][r] * v_r[c:c+8W]: each row piece is loaded once for all G
// heads into G*W accumulators (G*W + G + 1 <= 16 keeps them in registers; flat arrays and full
// unrolling keep GCC from spilling them to the stack every iteration).
template <int G, int W, typename T>
inline void weighted_piece(const float* const* p, const T* const* rows, int64_t n, int64_t c, int64_t D,
                           bool prefetch, float* o) {
  __m256 acc[G * W];
#pragma GCC unroll 16
  for (int i = 0; i < G * W; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t r = 0; r < n; ++r) {
    if (prefetch && r + PF < n) prefetch_row(rows[r + PF], D);
    __m256 pw[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) pw[g] = _mm256_broadcast_ss(p[g] + r);
#pragma GCC unroll 4
    for (int j = 0; j < W; ++j) {
      const __m256 x = load8(rows[r] + c + 8 * j);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) acc[g * W + j] = _mm256_fmadd_ps(pw[g], x, acc[g * W + j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < G * W; ++i) {
    float* og = o + (i / W) * D + c + 8 * (i % W);
    _mm256_storeu_ps(og, _mm256_add_ps(_mm256_loadu_ps(og), acc[i]));
  }
}

template <int G, typename T>
inline void weighted_sum(const float* const* p, const T* const* rows, int64_t n, int64_t D, float* o) {
  constexpr int W = G <= 3 ? 4 : (G <= 6 ? 2 : 1);
  int64_t c = 0;
  for (; c + 8 * W <= D; c += 8 * W) weighted_piece<G, W>(p, rows, n, c, D, c == 0, o);
  for (; c < D; c += 8) weighted_piece<G, 1>(p, rows, n, c, D, c == 0, o);  // D % 8 == 0 on this path
}
#endif


// In-place softmax of n scores, float32, max-subtracted; returns their log-sum-exp.
inline float softmax(float* s, int64_t n) {
  const float mx = row_max(s, n);
  const float sum = exp_sub_sum(s, n, mx);
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
  return mx + std::log(sum);
}

template <typename T>
inline float dot(const float* q, const T* k, int64_t D) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < D; ++d) acc += q[d] * to_float(k[d]);
  return acc;
}

// One task: one sequence, KV heads [h0, h1) and their G query heads each. Scores [(h - h0) * G + g, len].
// lse: null, or [H] receiving the task's query heads' log-sum-exp (decode_isa.h).
// Pass 1 walks the tokens once for all the task's heads, so each K row (Hkv x D, contiguous) streams
// through once. Fast path (AVX2, D % 8 == 0, G instantiated): FG = G; else FG = 0 (portable loops).
template <int FG, typename T>
void attend_heads(const float* q, const T* k, const T* v, const void* k_scale, const void* v_scale, bool log8,
                  const int64_t* slots, int64_t len, float* out, float* lse, int64_t G, int64_t Hkv, int64_t h0,
                  int64_t h1, int64_t D, float scale, std::vector<float>& scores, std::vector<const T*>& rows) {
  const int64_t nh = (h1 - h0) * G;
  scores.resize(nh * len);
  rows.resize(len);
  auto row_of = [&](int64_t t, int64_t h) { return slots[t] * Hkv + h; };
  // pass 1: raw scores
  int64_t t = 0;
#ifdef __AVX2__
  if constexpr (FG > 0) {
    for (; t + 1 < len; t += 2) {
      if (t + PF < len) {
        prefetch_row(k + row_of(t + PF, h0) * D, (h1 - h0) * D);
        prefetch_row(k + row_of(t + PF + 1, h0) * D, (h1 - h0) * D);
      }
      for (int64_t h = h0; h < h1; ++h)
        scores2<FG>(q + h * G * D, k + row_of(t, h) * D, k + row_of(t + 1, h) * D, D,
                    scores.data() + (h - h0) * G * len + t, len);
    }
  }
#endif
  for (; t < len; ++t)
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t g = 0; g < G; ++g)
        scores[((h - h0) * G + g) * len + t] = dot(q + (h * G + g) * D, k + row_of(t, h) * D, D);
  // scale (and per-row K scales), then softmax per query head in float32, max-subtracted
  for (int64_t j = 0; j < nh; ++j) {
    const int64_t h = h0 + j / G;
    float* s = scores.data() + j * len;
    if (k_scale != nullptr)
      for (int64_t i = 0; i < len; ++i) s[i] *= scale * scale_of(k_scale, log8, row_of(i, h));
    else
      for (int64_t i = 0; i < len; ++i) s[i] *= scale;
    const float l = softmax(s, len);
    if (lse != nullptr) lse[h0 * G + j] = l;
    if (v_scale != nullptr)  // fold V's per-row scale into the weights
      for (int64_t i = 0; i < len; ++i) s[i] *= scale_of(v_scale, log8, row_of(i, h));
  }
  // pass 2, per KV head: out_g = sum_t p[g, t] * v_t
  for (int64_t h = h0; h < h1; ++h) {
    for (int64_t i = 0; i < len; ++i) rows[i] = v + row_of(i, h) * D;
    float* o = out + h * G * D;
    const float* sh = scores.data() + (h - h0) * G * len;
    std::fill(o, o + G * D, 0.f);
#ifdef __AVX2__
    if constexpr (FG > 0) {
      const float* p[FG];
      for (int g = 0; g < FG; ++g) p[g] = sh + g * len;
      weighted_sum<FG>(p, rows.data(), len, D, o);
      continue;
    }
#endif
    for (int64_t i = 0; i < len; ++i)
      for (int64_t g = 0; g < G; ++g) {
        const float w = sh[g * len + i];
        const T* x = rows[i];
        float* og = o + g * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) og[d] += w * to_float(x[d]);
      }
  }
}

// Tokens [t0, t0 + len) of one sequence's context (block table `table`), KV heads [h0, h1).
template <typename T>
void attend_one(const float* q, const T* k, const T* v, const void* k_scale, const void* v_scale, bool log8,
                const int64_t* table, int64_t t0, int64_t len, float* out, float* lse, int64_t H, int64_t Hkv,
                int64_t D, int64_t block_size, float scale, int64_t h0, int64_t h1, bool avx512,
                std::vector<float>& scores, std::vector<const T*>& rows, std::vector<int64_t>& slots) {
  const int64_t G = H / Hkv;
  slots.resize(len);  // slot of each token, walked block by block (no division per token)
  for (int64_t t = 0, blk = t0 / block_size, i = t0 % block_size; t < len; ++blk, i = 0)
    for (int64_t base = table[blk] * block_size; i < block_size && t < len; ++i) slots[t++] = base + i;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, at::BFloat16>) {
    if (avx512 && k_scale == nullptr) {  // decode_avx512.cpp; false for shapes it has no path for
      scores.resize(tm_avx512::decode_scratch_floats(G, len, D, h1 - h0));
      if (tm_avx512::decode_heads(q, k, v, std::is_same_v<T, at::BFloat16>, slots.data(), len, out, lse, G, Hkv, h0,
                                  h1, D, scale, scores.data()))
        return;
    }
  }
  const bool fast = D % 8 == 0;
#define TM_HEADS(FG) attend_heads<FG>(q, k, v, k_scale, v_scale, log8, slots.data(), len, out, lse, G, Hkv, h0, h1, D, scale, scores, rows)
  if (fast && G == 1) TM_HEADS(1);
  else if (fast && G == 2) TM_HEADS(2);
  else if (fast && G == 3) TM_HEADS(3);
  else if (fast && G == 4) TM_HEADS(4);
  else if (fast && G == 6) TM_HEADS(6);
  else if (fast && G == 8) TM_HEADS(8);
  else TM_HEADS(0);
#undef TM_HEADS
}

// out[b] = the pieces' outputs of a split sequence b, each weighted by exp(its log-sum-exp - theirs):
// the softmax over the whole context.
void join_pieces(const std::vector<DecodeJoin>& joins, const std::vector<float>& part_out,
                 const std::vector<float>& part_lse, float* out, int64_t H, int64_t D) {
  const int64_t jobs = static_cast<int64_t>(joins.size()) * H;
  at::parallel_for(0, jobs, 1, [&](int64_t first, int64_t last) {
    std::vector<float> w;
    for (int64_t job = first; job < last; ++job) {
      const DecodeJoin& j = joins[job / H];
      const int64_t h = job % H;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p < j.count; ++p) mx = std::max(mx, part_lse[(j.first + p) * H + h]);
      w.resize(j.count);
      float total = 0.f;
      for (int64_t p = 0; p < j.count; ++p) total += w[p] = std::exp(part_lse[(j.first + p) * H + h] - mx);
      float* o = out + (j.b * H + h) * D;
      std::fill(o, o + D, 0.f);
      for (int64_t p = 0; p < j.count; ++p) {
        const float wp = w[p] / total;
        const float* x = part_out.data() + ((j.first + p) * H + h) * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] += wp * x[d];
      }
    }
  });
}

template <typename T>
void decode_kernel(const float* q, const T* k, const T* v, const void* k_scale, const void* v_scale,
                   bool log8, const int64_t* tables, const int64_t* seq_lens, float* out, int64_t B,
                   int64_t H, int64_t Hkv, int64_t D, int64_t max_blocks, int64_t block_size,
                   float scale, int64_t window) {
  const int64_t threads = at::get_num_threads();
  const bool avx512 = tokenmill_isa::active_level() >= tokenmill_isa::Level::kAvx512;
  const DecodePlan plan = tokenmill_decode::plan_decode(seq_lens, B, Hkv, window, threads, !tokenmill_isa::batch_invariant());
  std::vector<float> part_out(plan.parts * H * D), part_lse(plan.parts * H);
  const std::vector<int64_t> bounds = tokenmill_decode::balanced_ranges(plan.tasks, threads);
  at::parallel_for(0, static_cast<int64_t>(bounds.size()) - 1, 1, [&](int64_t first, int64_t last) {
    std::vector<float> scores;
    std::vector<const T*> rows;
    std::vector<int64_t> slots;
    for (int64_t i = bounds[first]; i < bounds[last]; ++i) {
      const DecodeTask& t = plan.tasks[i];
      float* o = t.part < 0 ? out + t.b * H * D : part_out.data() + t.part * H * D;
      float* lse = t.part < 0 ? nullptr : part_lse.data() + t.part * H;
      attend_one(q + t.b * H * D, k, v, k_scale, v_scale, log8, tables + t.b * max_blocks, t.t0, t.t1 - t.t0, o, lse,
                 H, Hkv, D, block_size, scale, t.h0, t.h1, avx512, scores, rows, slots);
    }
  });
  if (!plan.joins.empty()) join_pieces(plan.joins, part_out, part_lse, out, H, D);
}

}  // namespace

namespace tokenmill_ops {

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& k_scale, const at::Tensor& v_scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
                        double scale, int64_t window) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q: [B, H, D] float32");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous(), "cache: [slots, Hkv, D]");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "k and v cache dtypes differ");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous(), "block_tables: int64");
  TORCH_CHECK(seq_lens.scalar_type() == at::kLong && seq_lens.is_contiguous(), "seq_lens: int64");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == D && H % Hkv == 0, "head shapes do not match");
  TORCH_CHECK(block_tables.size(0) == B && seq_lens.size(0) == B, "batch sizes do not match");
  const bool quantized = k_scale.numel() > 0;
  const bool log8 = quantized && k_scale.scalar_type() == at::kChar;
  TORCH_CHECK(!quantized || log8 || k_scale.scalar_type() == at::kFloat, "scales: int8 log8 codes or float32");
  const void* ks = quantized ? k_scale.data_ptr() : nullptr;
  const void* vs = quantized ? v_scale.data_ptr() : nullptr;
  auto out = new_tensor(q.sizes(), q.options());  // q is contiguous
  const int64_t max_blocks = block_tables.size(1);
  const auto* tables = block_tables.data_ptr<int64_t>();
  const auto* lens = seq_lens.data_ptr<int64_t>();
  const float s = static_cast<float>(scale);
  switch (k_cache.scalar_type()) {
    case at::kFloat:
      decode_kernel(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), ks, vs, log8,
                    tables, lens, out.data_ptr<float>(), B, H, Hkv, D, max_blocks, block_size, s, window);
      break;
    case at::kBFloat16:
      decode_kernel(q.data_ptr<float>(), k_cache.data_ptr<at::BFloat16>(), v_cache.data_ptr<at::BFloat16>(), ks,
                    vs, log8, tables, lens, out.data_ptr<float>(), B, H, Hkv, D, max_blocks, block_size, s, window);
      break;
    case at::kChar:
      decode_kernel(q.data_ptr<float>(), k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>(), ks, vs, log8,
                    tables, lens, out.data_ptr<float>(), B, H, Hkv, D, max_blocks, block_size, s, window);
      break;
    case at::kFloat8_e4m3fn:
      decode_kernel(q.data_ptr<float>(), k_cache.data_ptr<c10::Float8_e4m3fn>(),
                    v_cache.data_ptr<c10::Float8_e4m3fn>(), ks, vs, log8, tables, lens, out.data_ptr<float>(), B,
                    H, Hkv, D, max_blocks, block_size, s, window);
      break;
    default:
      TORCH_CHECK(false, "unsupported KV cache dtype ", k_cache.scalar_type());
  }
  return out;
}

}  // namespace tokenmill_ops
