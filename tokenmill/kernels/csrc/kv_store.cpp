// Store a step's new K/V rows into the paged cache: cache[slot[t]] = x[t] for K and V.
// Plain caches only (no quantization), x in the cache's dtype; x may be a strided view ([T, Hkv, D]
// slices of the fused qkv output). aten::index_copy_ has a high fixed cost for a few dozen rows
// (two calls per layer per step; docs/BENCHMARKS_HISTORY.md); this is a row memcpy.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

namespace {

void store_rows(at::Tensor& cache, const at::Tensor& x, const int64_t* slots, int64_t T) {
  const int64_t H = cache.size(1), D = cache.size(2), esize = cache.element_size();
  const int64_t num_slots = cache.size(0);
  auto* dst = static_cast<char*>(cache.data_ptr());
  const auto* src = static_cast<const char*>(x.data_ptr());
  const int64_t s0 = x.stride(0) * esize, s1 = x.stride(1) * esize, row = H * D * esize;
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot ", slots[t], " outside the cache of ", num_slots);
    char* d = dst + slots[t] * row;
    for (int64_t h = 0; h < H; ++h) std::memcpy(d + h * D * esize, src + t * s0 + h * s1, D * esize);
  }
}

void store_kv(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slots) {
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(), "caches: [slots, Hkv, D], contiguous, same shape");
  TORCH_CHECK(k.dim() == 3 && v.dim() == 3 && k.size(1) == k_cache.size(1) && k.size(2) == k_cache.size(2) &&
                  v.sizes() == k.sizes(), "k, v: [T, Hkv, D] matching the cache");
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type(),
              "k, v must already have the cache's dtype");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "k, v: the last dimension must be contiguous");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.size(0) == k.size(0) &&
                  slots.is_contiguous(), "slots: [T] int64");
  const int64_t T = k.size(0);
  store_rows(k_cache, k, slots.data_ptr<int64_t>(), T);
  store_rows(v_cache, v, slots.data_ptr<int64_t>(), T);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tokenmill, m) {
  m.def("store_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor slots) -> ()");
}

TORCH_LIBRARY_IMPL(tokenmill, CPU, m) { m.impl("store_kv", &store_kv); }
