// A pure decode step through a Llama-family layer stack in one call: the same kernels, in the same
// order and on the same tensors as the Python layers (models/llama.py with the cpu attention backend),
// so the result is bit-identical; what goes is the Python and dispatcher work between them (~55 us a
// layer, 12-15% of a batch-1 decode step of SmolLM2-135M; docs/BENCHMARKS.md).
//
// Per layer l, weights[10 l ...]: input norm, qkv (packed, bias), o (packed, bias), post-attention
// norm, gate_up (packed, bias), down (packed, bias); an undefined or empty bias is none. layer_ints[6 l
// ...]: the weight kind of qkv, o, gate_up, down (0 float32 panels, 1 bf16 panels), whether gate_up
// and down take the fused bf16 SwiGLU (bf16_swiglu), and the layer's sliding window (0: none). dims:
// layers to run, heads, KV heads, head dim, intermediate size, KV block size. Each kernel call is
// recorded under its op's name, so profiles keep their per-kernel rows.
#include <ATen/record_function.h>

#include <vector>

#include "ops.h"

namespace {

using tokenmill_ops::new_tensor;

constexpr int64_t kWeightsPerLayer = 10, kIntsPerLayer = 6;

c10::optional<at::Tensor> bias_of(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

at::Tensor linear(int64_t kind, const at::Tensor& x, const at::Tensor& packed, int64_t N, const at::Tensor& bias) {
  if (kind == 1) {
    RECORD_FUNCTION("tokenmill::bf16_panel_linear", std::vector<c10::IValue>());
    return tokenmill_ops::bf16_panel_linear(x, packed, N, bias_of(bias));
  }
  RECORD_FUNCTION("tokenmill::panel_linear", std::vector<c10::IValue>());
  return tokenmill_ops::panel_linear(x, packed, N, bias_of(bias));
}

struct Shape {
  int64_t H, Hkv, D, inter, block_size;
  int64_t q_size() const { return H * D; }
  int64_t kv_size() const { return Hkv * D; }
};

// Attention of one layer: h [B, hidden] (normed) -> o_proj's output [B, hidden].
at::Tensor attention(const at::Tensor* w, const int64_t* ints, const Shape& s, const at::Tensor& h,
                     at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     double scale) {
  const int64_t B = h.size(0), hidden = h.size(1);
  const at::Tensor qkv = linear(ints[0], h, w[1], s.q_size() + 2 * s.kv_size(), w[2]);
  at::Tensor q = qkv.narrow(1, 0, s.q_size()).view({B, s.H, s.D});
  at::Tensor k = qkv.narrow(1, s.q_size(), s.kv_size()).view({B, s.Hkv, s.D});
  at::Tensor v = qkv.narrow(1, s.q_size() + s.kv_size(), s.kv_size()).view({B, s.Hkv, s.D});
  for (at::Tensor* t : {&q, &k}) {  // one record per call, as the Python layers' profile counts them
    RECORD_FUNCTION("tokenmill::rotary_", std::vector<c10::IValue>());
    tokenmill_ops::rotary_(*t, cos, sin);
  }
  {
    RECORD_FUNCTION("tokenmill::store_kv", std::vector<c10::IValue>());
    tokenmill_ops::store_kv(k_cache, v_cache, k, v, slots);
  }
  at::Tensor out;
  {
    RECORD_FUNCTION("tokenmill::paged_decode", std::vector<c10::IValue>());
    const at::Tensor none = new_tensor({0}, qkv.options());
    out = tokenmill_ops::paged_decode(q.contiguous(), k_cache, v_cache, none, none, block_tables, seq_lens,
                                      s.block_size, scale, ints[5]);
  }
  return linear(ints[1], out.view({B, s.q_size()}), w[3], hidden, w[4]);
}

// MLP of one layer: h [B, hidden] (normed) -> down's output.
at::Tensor mlp(const at::Tensor* w, const int64_t* ints, const Shape& s, const at::Tensor& h) {
  const int64_t hidden = h.size(1);
  at::Tensor act;
  if (ints[4]) {
    RECORD_FUNCTION("tokenmill::bf16_swiglu", std::vector<c10::IValue>());
    act = tokenmill_ops::bf16_swiglu(h, w[6], s.inter);
  } else {
    const at::Tensor gate_up = linear(ints[2], h, w[6], 2 * s.inter, w[7]);
    RECORD_FUNCTION("tokenmill::silu_and_mul", std::vector<c10::IValue>());
    act = tokenmill_ops::silu_and_mul(gate_up);
  }
  return linear(ints[3], act, w[8], hidden, w[9]);
}

}  // namespace

namespace tokenmill_ops {

// x [B, hidden]: the embeddings, one row per sequence. Returns (the last layer's MLP output, the
// residual stream before it): the caller's final norm adds them, as after the Python layers.
std::vector<at::Tensor> decode_layers(const at::Tensor& x, at::TensorList weights, at::TensorList kv,
                                      const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                                      const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                      at::IntArrayRef dims, at::IntArrayRef layer_ints, double eps, double scale) {
  TORCH_CHECK(dims.size() == 6, "dims: layers, heads, kv heads, head dim, intermediate, block size");
  const int64_t L = dims[0];
  const Shape s{dims[1], dims[2], dims[3], dims[4], dims[5]};
  TORCH_CHECK(L >= 1 && static_cast<int64_t>(weights.size()) >= L * kWeightsPerLayer &&
                  static_cast<int64_t>(layer_ints.size()) >= L * kIntsPerLayer &&
                  static_cast<int64_t>(kv.size()) >= 2 * L,
              "weights, layer_ints and kv must cover every layer run");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x: [B, hidden] float32");
  at::Tensor hidden = x, residual;
  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor* w = weights.data() + l * kWeightsPerLayer;
    const int64_t* ints = layer_ints.data() + l * kIntsPerLayer;
    at::Tensor h;
    if (!residual.defined()) {  // the first layer: the residual stream starts as the embeddings
      RECORD_FUNCTION("tokenmill::rms_norm", std::vector<c10::IValue>());
      residual = hidden;
      h = rms_norm(hidden, w[0], eps);
    } else {
      RECORD_FUNCTION("tokenmill::fused_add_rms_norm", std::vector<c10::IValue>());
      fused_add_rms_norm(hidden, residual, w[0], eps);
      h = hidden;
    }
    at::Tensor o = attention(w, ints, s, h, kv[2 * l], kv[2 * l + 1], cos, sin, slots, block_tables, seq_lens,
                             scale);
    {
      RECORD_FUNCTION("tokenmill::fused_add_rms_norm", std::vector<c10::IValue>());
      fused_add_rms_norm(o, residual, w[5], eps);
    }
    hidden = mlp(w, ints, s, o);
  }
  return {hidden, residual};
}

}  // namespace tokenmill_ops
