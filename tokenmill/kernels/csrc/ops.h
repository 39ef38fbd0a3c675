// Every op the kernels export, as plain C++ functions; register_ops.cpp declares their schemas and
// registers them with the dispatcher. Kernel units include only this (ATen's Tensor) and
// ATen/Parallel.h: torch/library.h and ATen/ATen.h took most of each unit's compile time.
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <vector>

namespace tokenmill_ops {

// An op's output: a new CPU tensor straight from the allocator (at::empty goes through the dispatcher
// first; these ops allocate on every call, hundreds of times per decode step)
inline at::Tensor new_tensor(at::IntArrayRef size, const at::TensorOptions& options) {
  return at::detail::empty_cpu(size, options);
}

// panel_gemm.cpp, bf16_gemm.cpp: linear layers over weights packed once at load
at::Tensor pack_panels(const at::Tensor& weight);
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const c10::optional<at::Tensor>& bias);
at::Tensor pack_bf16_panels(const at::Tensor& weight);
at::Tensor bf16_panel_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                             const c10::optional<at::Tensor>& bias);
at::Tensor bf16_swiglu(const at::Tensor& x, const at::Tensor& packed, int64_t inter);
at::Tensor bf16_argmax_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t n_valid);

// quant_gemm.cpp: block-quantized (int4/int8) weights
at::Tensor pack_q4(const at::Tensor& codes, const at::Tensor& d, const at::Tensor& m);
at::Tensor pack_q8(const at::Tensor& codes, const at::Tensor& d);
at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& records, int64_t N, const c10::optional<at::Tensor>& bias);
at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& records, int64_t N, const c10::optional<at::Tensor>& bias);
at::Tensor q_dequantize(const at::Tensor& records, int64_t bits, int64_t N, int64_t K);
at::Tensor q_dequantize_rows(const at::Tensor& records, int64_t bits, int64_t N, int64_t K, const at::Tensor& ids);
// quant_argmax.cpp: greedy tokens from a block-quantized LM head, without the logits
at::Tensor q_argmax_linear(const at::Tensor& x, const at::Tensor& records, int64_t bits, int64_t N, int64_t n_valid);

// paged_decode.cpp, prefill_attention.cpp, kv_store.cpp: attention over the paged KV cache
at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& k_scale, const at::Tensor& v_scale, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, int64_t block_size, double scale, int64_t window);
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t context,
                             double scale, bool bf16_math);
void store_kv(at::Tensor k_cache, at::Tensor v_cache, at::Tensor k, at::Tensor v, const at::Tensor& slots);

// layer_ops.cpp: fused element-wise layer ops (float32)
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
void rotary_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// layer_stack.cpp: a step (decodes and prompt chunks) through a Llama-family layer stack (the kernels
// above, in order)
std::vector<at::Tensor> layer_stack(const at::Tensor& x, at::TensorList weights, at::TensorList kv,
                                    const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                                    const at::Tensor& decode_rows, const at::Tensor& block_tables,
                                    const at::Tensor& seq_lens, at::IntArrayRef chunk_ints, at::TensorList chunk_blocks,
                                    at::IntArrayRef dims, at::IntArrayRef layer_ints, double eps, double scale);

}  // namespace tokenmill_ops
