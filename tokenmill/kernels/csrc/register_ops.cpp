// The one unit that includes torch/library.h: every tokenmill:: op's schema and its CPU kernel.
#include <torch/library.h>

#include <string>
#include <vector>

#include "cpu_isa.h"
#include "gemm_split.h"
#include "ops.h"

TORCH_LIBRARY(tokenmill, m) {
  m.def("cpu_isa() -> str", []() { return tokenmill_isa::describe_isa(); });
  m.def("set_cpu_isa(str cap) -> str", [](std::string cap) { return tokenmill_isa::set_isa(cap); });
  m.def("set_batch_invariant(bool on) -> bool", [](bool on) { return tokenmill_isa::set_batch_invariant(on); });
  // the GEMMs' grid of tasks (gemm_split.h): [unit slices, row slices]
  m.def("gemm_split(int units, int M, int threads, int min_units) -> int[]",
        [](int64_t units, int64_t M, int64_t threads, int64_t min_units) {
          const auto s = tokenmill_gemm::split_gemm(units, M, threads, min_units);
          return std::vector<int64_t>{s.unit_slices, s.row_slices};
        });

  m.def("pack_panels(Tensor weight) -> Tensor");
  m.def("panel_linear(Tensor x, Tensor packed, int N, Tensor? bias) -> Tensor");
  m.def("pack_bf16_panels(Tensor weight) -> Tensor");
  m.def("bf16_panel_linear(Tensor x, Tensor packed, int N, Tensor? bias) -> Tensor");
  m.def("bf16_swiglu(Tensor x, Tensor packed, int inter) -> Tensor");
  m.def("bf16_argmax_linear(Tensor x, Tensor packed, int N, int n_valid) -> Tensor");

  m.def("pack_q4(Tensor codes, Tensor d, Tensor m) -> Tensor");
  m.def("pack_q8(Tensor codes, Tensor d) -> Tensor");
  m.def("q4_linear(Tensor x, Tensor records, int N, Tensor? bias) -> Tensor");
  m.def("q8_linear(Tensor x, Tensor records, int N, Tensor? bias) -> Tensor");
  m.def("q_argmax_linear(Tensor x, Tensor records, int bits, int N, int n_valid) -> Tensor");
  m.def("q_dequantize(Tensor records, int bits, int N, int K) -> Tensor");
  m.def("q_dequantize_rows(Tensor records, int bits, int N, int K, Tensor ids) -> Tensor");

  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor k_scale, Tensor v_scale, "
        "Tensor block_tables, Tensor seq_lens, int block_size, float scale, int window=0) -> Tensor");
  m.def("prefill_attention(Tensor q, Tensor k, Tensor v, int context, float scale, bool bf16_math=False) -> Tensor");
  // k and v are written only when float32 rows go into a bf16 cache (rounded in place)
  m.def("store_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor(c!) k, Tensor(d!) v, Tensor slots) -> ()");

  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
  m.def("rotary_(Tensor(a!) x, Tensor cos, Tensor sin) -> ()");

  // writes the caches (kv) and the embeddings x, which become the residual stream
  m.def("layer_stack(Tensor(a!) x, Tensor[] weights, Tensor(b!)[] kv, Tensor cos, Tensor sin, Tensor slots, "
        "Tensor decode_rows, Tensor block_tables, Tensor seq_lens, int[] chunk_ints, Tensor[] chunk_blocks, "
        "int[] dims, int[] layer_ints, float eps, float scale) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(tokenmill, CPU, m) {
  using namespace tokenmill_ops;
  m.impl("pack_panels", &pack_panels);
  m.impl("panel_linear", &panel_linear);
  m.impl("pack_bf16_panels", &pack_bf16_panels);
  m.impl("bf16_panel_linear", &bf16_panel_linear);
  m.impl("bf16_swiglu", &bf16_swiglu);
  m.impl("bf16_argmax_linear", &bf16_argmax_linear);
  m.impl("pack_q4", &pack_q4);
  m.impl("pack_q8", &pack_q8);
  m.impl("q4_linear", &q4_linear);
  m.impl("q8_linear", &q8_linear);
  m.impl("q_argmax_linear", &q_argmax_linear);
  m.impl("q_dequantize", &q_dequantize);
  m.impl("q_dequantize_rows", &q_dequantize_rows);
  m.impl("paged_decode", &paged_decode);
  m.impl("prefill_attention", &prefill_attention);
  m.impl("store_kv", &store_kv);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rotary_", &rotary_);
  m.impl("layer_stack", &layer_stack);
}
