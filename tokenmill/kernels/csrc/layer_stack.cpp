// A step (decodes, prompt chunks, or both) through a Llama-family layer stack in one call: the same
// kernels, in the same order and on the same tensors as the Python layers (models/llama.py with the
// cpu attention backend, attention/cpu_paged.py), so the result is bit-identical; what goes is the
// Python and dispatcher work between them (~55 us a layer, 12-15% of a batch-1 decode step of
// SmolLM2-135M; docs/BENCHMARKS.md) and, in the server, re-taking the GIL after every kernel.
//
// Per layer l, weights[10 l ...]: input norm, qkv (packed, bias), o (packed, bias), post-attention
// norm, gate_up (packed, bias), down (packed, bias); an undefined or empty bias is none. layer_ints[6 l
// ...]: the weight kind of qkv, o, gate_up, down (0 float32 panels, 1 bf16 panels, 2/3 4/8-bit block
// records), whether gate_up and down take the fused bf16 SwiGLU (bf16_swiglu), and the layer's sliding
// window (0: none). dims: layers to run, heads, KV heads, head dim, intermediate size, KV block size.
// The step's attention: decode rows (decode_rows [Bd] flat row of each, block_tables [Bd, NB],
// seq_lens [Bd]; with no prompt chunks every row is a decode, in order, and decode_rows is unused),
// and prompt chunks, 4 ints each in chunk_ints (first row, end row, tokens cached before it, bf16
// math) with their block rows in chunk_blocks. No chunk may have a sliding window that binds (the
// Python layers run those through SDPA). Each kernel call is recorded under its op's name, so
// profiles keep their per-kernel rows.
#include <ATen/record_function.h>

#include <vector>

#include "ops.h"

namespace {

using tokenmill_ops::new_tensor;

constexpr int64_t kWeightsPerLayer = 10, kIntsPerLayer = 6, kIntsPerChunk = 4;

c10::optional<at::Tensor> bias_of(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// The weight kinds of models/linear.py's NativeLinear, by index: each kernel and the op name its calls
// are recorded under.
struct LinearKind {
  const char* name;
  at::Tensor (*fn)(const at::Tensor&, const at::Tensor&, int64_t, const c10::optional<at::Tensor>&);
};
const LinearKind kLinearKinds[] = {{"tokenmill::panel_linear", tokenmill_ops::panel_linear},
                                   {"tokenmill::bf16_panel_linear", tokenmill_ops::bf16_panel_linear},
                                   {"tokenmill::q4_linear", tokenmill_ops::q4_linear},
                                   {"tokenmill::q8_linear", tokenmill_ops::q8_linear}};

at::Tensor linear(int64_t kind, const at::Tensor& x, const at::Tensor& packed, int64_t N, const at::Tensor& bias) {
  TORCH_CHECK(0 <= kind && kind < 4, "weight kind ", kind, ": 0 float32 panels, 1 bf16 panels, 2 q4 records, 3 q8 records");
  RECORD_FUNCTION(kLinearKinds[kind].name, std::vector<c10::IValue>());
  return kLinearKinds[kind].fn(x, packed, N, bias_of(bias));
}

struct Shape {
  int64_t H, Hkv, D, inter, block_size;
  int64_t q_size() const { return H * D; }
  int64_t kv_size() const { return Hkv * D; }
};

struct Chunk {
  int64_t start, end, context;
  bool bf16;
  at::Tensor blocks;  // [NB] int64
};

// The step's attention inputs, the same for every layer.
struct Step {
  at::Tensor slots, decode_rows, block_tables, seq_lens;
  std::vector<Chunk> chunks;
  bool has_decodes() const { return block_tables.size(0) > 0; }
};

// A chunk's keys or values as the cache holds them: the first `length` rows of its blocks, in `dtype`
// (gather_blocks in attention/kv_cache.py).
at::Tensor gather(const at::Tensor& cache, const Chunk& c, int64_t length, const Shape& s, at::ScalarType dtype) {
  const at::Tensor blocks = cache.view({-1, s.block_size, s.Hkv, s.D}).index_select(0, c.blocks);
  return blocks.view({-1, s.Hkv, s.D}).narrow(0, 0, length).to(dtype);
}

// The backend's forward after store_kv: decodes through paged_decode, chunks through
// prefill_attention over this step's k/v (a fresh prompt) or the cache (one with cached context).
at::Tensor attend(const Step& st, const Shape& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& k_cache, const at::Tensor& v_cache, double scale, int64_t window) {
  const at::Tensor none = new_tensor({0}, q.options());
  if (st.chunks.empty()) {  // a pure decode step: every row, in order
    RECORD_FUNCTION("tokenmill::paged_decode", std::vector<c10::IValue>());
    return tokenmill_ops::paged_decode(q.contiguous(), k_cache, v_cache, none, none, st.block_tables, st.seq_lens,
                                       s.block_size, scale, window);
  }
  at::Tensor out = new_tensor(q.sizes(), q.options());
  if (st.has_decodes()) {
    RECORD_FUNCTION("tokenmill::paged_decode", std::vector<c10::IValue>());
    const at::Tensor o = tokenmill_ops::paged_decode(q.index_select(0, st.decode_rows), k_cache, v_cache, none, none,
                                                     st.block_tables, st.seq_lens, s.block_size, scale, window);
    out.index_copy_(0, st.decode_rows, o);
  }
  for (const Chunk& c : st.chunks) {
    const int64_t n = c.end - c.start;
    at::Tensor kb, vb;
    if (c.context == 0) {
      kb = k.narrow(0, c.start, n);
      vb = v.narrow(0, c.start, n);
    } else {
      const at::ScalarType dtype = c.bf16 ? at::kBFloat16 : q.scalar_type();
      kb = gather(k_cache, c, c.context + n, s, dtype);
      vb = gather(v_cache, c, c.context + n, s, dtype);
    }
    RECORD_FUNCTION("tokenmill::prefill_attention", std::vector<c10::IValue>());
    out.narrow(0, c.start, n).copy_(tokenmill_ops::prefill_attention(q.narrow(0, c.start, n), kb, vb, c.context,
                                                                     scale, c.bf16));
  }
  return out;
}

// Attention of one layer: h [T, hidden] (normed) -> o_proj's output [T, hidden].
at::Tensor attention(const at::Tensor* w, const int64_t* ints, const Shape& s, const at::Tensor& h,
                     at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& cos, const at::Tensor& sin,
                     const Step& st, double scale) {
  const int64_t T = h.size(0), hidden = h.size(1);
  const at::Tensor qkv = linear(ints[0], h, w[1], s.q_size() + 2 * s.kv_size(), w[2]);
  at::Tensor q = qkv.narrow(1, 0, s.q_size()).view({T, s.H, s.D});
  at::Tensor k = qkv.narrow(1, s.q_size(), s.kv_size()).view({T, s.Hkv, s.D});
  at::Tensor v = qkv.narrow(1, s.q_size() + s.kv_size(), s.kv_size()).view({T, s.Hkv, s.D});
  for (at::Tensor* t : {&q, &k}) {  // one record per call, as the Python layers' profile counts them
    RECORD_FUNCTION("tokenmill::rotary_", std::vector<c10::IValue>());
    tokenmill_ops::rotary_(*t, cos, sin);
  }
  {
    RECORD_FUNCTION("tokenmill::store_kv", std::vector<c10::IValue>());
    tokenmill_ops::store_kv(k_cache, v_cache, k, v, st.slots);
  }
  const at::Tensor out = attend(st, s, q, k, v, k_cache, v_cache, scale, ints[5]);
  return linear(ints[1], out.view({T, s.q_size()}), w[3], hidden, w[4]);
}

// MLP of one layer: h [T, hidden] (normed) -> down's output.
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

Step step_of(const at::Tensor& x, const at::Tensor& slots, const at::Tensor& decode_rows,
             const at::Tensor& block_tables, const at::Tensor& seq_lens, at::IntArrayRef chunk_ints,
             at::TensorList chunk_blocks) {
  const int64_t T = x.size(0), n_chunks = static_cast<int64_t>(chunk_blocks.size());
  TORCH_CHECK(static_cast<int64_t>(chunk_ints.size()) == kIntsPerChunk * n_chunks,
              "chunk_ints: first row, end row, context, bf16 math for each chunk of chunk_blocks");
  TORCH_CHECK(block_tables.dim() == 2 && seq_lens.size(0) == block_tables.size(0), "block_tables [Bd, NB], seq_lens [Bd]");
  TORCH_CHECK(n_chunks > 0 || block_tables.size(0) == T, "a step without prompt chunks has one decode per row");
  TORCH_CHECK(n_chunks == 0 || decode_rows.numel() == block_tables.size(0), "decode_rows: one flat row per decode");
  Step st{slots, decode_rows, block_tables, seq_lens, {}};
  for (int64_t i = 0; i < n_chunks; ++i) {
    const int64_t* c = chunk_ints.data() + kIntsPerChunk * i;
    TORCH_CHECK(0 <= c[0] && c[0] < c[1] && c[1] <= T && c[2] >= 0, "chunk rows out of range");
    st.chunks.push_back({c[0], c[1], c[2], c[3] != 0, chunk_blocks[i]});
  }
  return st;
}

}  // namespace

namespace tokenmill_ops {

// x [T, hidden]: the embeddings, one row per token. Returns (the last layer's MLP output, the
// residual stream before it): the caller's final norm adds them, as after the Python layers.
std::vector<at::Tensor> layer_stack(const at::Tensor& x, at::TensorList weights, at::TensorList kv,
                                    const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                                    const at::Tensor& decode_rows, const at::Tensor& block_tables,
                                    const at::Tensor& seq_lens, at::IntArrayRef chunk_ints, at::TensorList chunk_blocks,
                                    at::IntArrayRef dims, at::IntArrayRef layer_ints, double eps, double scale) {
  TORCH_CHECK(dims.size() == 6, "dims: layers, heads, kv heads, head dim, intermediate, block size");
  const int64_t L = dims[0];
  const Shape s{dims[1], dims[2], dims[3], dims[4], dims[5]};
  TORCH_CHECK(L >= 1 && static_cast<int64_t>(weights.size()) >= L * kWeightsPerLayer &&
                  static_cast<int64_t>(layer_ints.size()) >= L * kIntsPerLayer &&
                  static_cast<int64_t>(kv.size()) >= 2 * L,
              "weights, layer_ints and kv must cover every layer run");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x: [T, hidden] float32");
  const Step st = step_of(x, slots, decode_rows, block_tables, seq_lens, chunk_ints, chunk_blocks);
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
    at::Tensor o = attention(w, ints, s, h, kv[2 * l], kv[2 * l + 1], cos, sin, st, scale);
    {
      RECORD_FUNCTION("tokenmill::fused_add_rms_norm", std::vector<c10::IValue>());
      fused_add_rms_norm(o, residual, w[5], eps);
    }
    hidden = mlp(w, ints, s, o);
  }
  return {hidden, residual};
}

}  // namespace tokenmill_ops
