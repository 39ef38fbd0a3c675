// Store a step's new K/V rows into the paged cache: cache[slot[t]] = x[t] for K and V.
// Plain caches only (no quantization), x in the cache's dtype or float32 into a bfloat16 cache
// (rounded to nearest even, as torch's conversion, and rounded in x too); x may be a strided view ([T, Hkv, D] slices of
// the fused qkv output). aten::index_copy_ has a high fixed cost for a few dozen rows
// (two calls per layer per step; docs/BENCHMARKS_HISTORY.md); this is a row memcpy.
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#include "ops.h"

namespace {

// tokens per task: a prefill chunk's rows go to every thread (first writes to a cache page fault it in,
// so the copy is slower than its bytes suggest); a decode step's few rows stay on one
constexpr int64_t kGrain = 64;

void store_rows(at::Tensor& cache, at::Tensor& x, const int64_t* slots, int64_t T) {
  const int64_t H = cache.size(1), D = cache.size(2), esize = cache.element_size();
  auto* dst = static_cast<char*>(cache.data_ptr());
  const auto* src = static_cast<const char*>(x.data_ptr());
  const int64_t s0 = x.stride(0) * esize, s1 = x.stride(1) * esize, row = H * D * esize;
  at::parallel_for(0, T, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      char* d = dst + slots[t] * row;
      for (int64_t h = 0; h < H; ++h) std::memcpy(d + h * D * esize, src + t * s0 + h * s1, D * esize);
    }
  });
}

// float32 rows -> bf16 cache rows, rounded to nearest even (NaN stays NaN); the rounded values are
// written back into x, so that this step's attention sees exactly what later steps read from the
// cache (a prefix-cache hit then gives the same numbers as computing the prefix afresh).
inline uint16_t round_bf16(float& f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  u = nan ? (u | 0x00400000u) : u + 0x7FFFu + ((u >> 16) & 1u);
  const uint32_t r = u & 0xFFFF0000u;
  std::memcpy(&f, &r, sizeof(f));
  return static_cast<uint16_t>(u >> 16);
}

void store_rows_bf16(at::Tensor& cache, at::Tensor& x, const int64_t* slots, int64_t T) {
  const int64_t H = cache.size(1), D = cache.size(2);
  auto* dst = reinterpret_cast<uint16_t*>(cache.data_ptr<at::BFloat16>());
  float* src = x.data_ptr<float>();
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  at::parallel_for(0, T, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float* in = src + t * s0 + h * s1;
        uint16_t* out = dst + (slots[t] * H + h) * D;
#pragma omp simd
        for (int64_t i = 0; i < D; ++i) out[i] = round_bf16(in[i]);
      }
  });
}

}  // namespace

namespace tokenmill_ops {

void store_kv(at::Tensor k_cache, at::Tensor v_cache, at::Tensor k, at::Tensor v, const at::Tensor& slots) {
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(), "caches: [slots, Hkv, D], contiguous, same shape");
  TORCH_CHECK(k.dim() == 3 && v.dim() == 3 && k.size(1) == k_cache.size(1) && k.size(2) == k_cache.size(2) &&
                  v.sizes() == k.sizes(), "k, v: [T, Hkv, D] matching the cache");
  TORCH_CHECK(k.scalar_type() == v.scalar_type() && k_cache.scalar_type() == v_cache.scalar_type(),
              "k and v (and the two caches) must share a dtype");
  const bool to_bf16 = k.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() || to_bf16,
              "k, v must have the cache's dtype (or be float32 for a bfloat16 cache)");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "k, v: the last dimension must be contiguous");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.size(0) == k.size(0) &&
                  slots.is_contiguous(), "slots: [T] int64");
  const int64_t T = k.size(0), num_slots = k_cache.size(0);
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "slot ", sp[t], " outside the cache of ", num_slots);
  const auto store = to_bf16 ? store_rows_bf16 : store_rows;
  store(k_cache, k, sp, T);
  store(v_cache, v, sp, T);
}

}  // namespace tokenmill_ops
