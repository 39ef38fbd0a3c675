"""The C++ layer stack (models/native_stack.py, kernels/csrc/layer_stack.cpp) against the Python layers
it replaces: tolerance 0 (the same kernels on the same tensors, in the same order), checked on every
token's top log-probabilities, and on the KV cache both paths leave. Steps of every kind: prompts alone,
chunks over cached context (chunked prefill, prefix hits), prompt chunks beside decodes, pure decodes,
a preempted request's recompute, speculative verification, batch-invariant decode rows."""
from types import SimpleNamespace

import pytest
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.kernels import cpu_ops
from tokenmill.models.native_stack import NativeLayerStack
from tokenmill.quant.checkpoint import CheckpointBlockMethod
from tiny_models import make_tiny_model

TOKENS = [3 + (i * 37) % 500 for i in range(60)]
# lengths 40 and 23 run past mistral's window of 8 below; 3 stays inside one KV block
PROMPTS = [{"prompt_token_ids": TOKENS[:40]}, {"prompt_token_ids": TOKENS[5:8]},
           {"prompt_token_ids": TOKENS[30:53]}]
SCORED = SamplingParams(max_tokens=12, temperature=0, logprobs=4, ignore_eos=True)


def _run(llm: LLM, native: bool, prompts=PROMPTS, params=SCORED) -> tuple[list, dict, list[torch.Tensor]]:
    """(token ids and log-probabilities of each output, how many steps of each kind the stack ran, the KV
    caches) of a fresh engine (the same blocks in both runs)."""
    model = llm.llm_engine.runner.model
    stack = NativeLayerStack.build(model) if native else None
    assert (stack is not None) == native
    ran = {"decode": 0, "chunks": 0, "mixed": 0, "declined": 0}
    if stack is not None:
        run = stack.run

        def counted(x, cos_sin, kv_caches, backend, meta):
            out = run(x, cos_sin, kv_caches, backend, meta)
            ran["declined" if out is None else "chunks" if meta.prefills else "decode"] += 1
            ran["mixed"] += out is not None and bool(meta.prefills) and meta.decodes is not None
            return out
        stack.run = counted
    model.__dict__["_native_stack"] = stack
    outs = llm.generate(prompts, params, use_tqdm=False)
    caches = [t.clone() for cache in llm.llm_engine.runner.kv_caches for t in cache]
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs], ran, caches


def _engine(folder, dtype: str, kv_dtype: str = "auto", **kwargs) -> LLM:
    kwargs = {"num_kv_blocks": 64, "block_size": 16, "enable_prefix_caching": False, **kwargs}
    return LLM(str(folder), dtype=dtype, kv_cache_dtype=kv_dtype, **kwargs)


def _same(folder, dtype: str, kv_dtype: str = "auto", prompts=PROMPTS, params=SCORED, **kwargs) -> dict:
    """Both paths on fresh engines: identical outputs and caches; returns the native run's step counts."""
    python, _, python_cache = _run(_engine(folder, dtype, kv_dtype, **kwargs), False, prompts, params)
    native, ran, native_cache = _run(_engine(folder, dtype, kv_dtype, **kwargs), True, prompts, params)
    assert native == python
    assert all(torch.equal(a, b) for a, b in zip(native_cache, python_cache))
    return ran


@pytest.mark.parametrize("arch,dtype,kv_dtype,overrides,quantization", [
    ("llama", "float32", "auto", {}, "none"),                          # float32 panels, SiLU-mul op
    ("llama", "bfloat16", "auto", {}, "none"),                         # bf16 panels, fused SwiGLU, bf16 cache
    ("llama", "float32", "bfloat16", {}, "none"),                      # float32 weights over a bf16 cache
    ("qwen2", "bfloat16", "auto", {}, "none"),                         # q/k/v biases
    ("llama", "bfloat16", "auto", {"intermediate_size": 80}, "none"),  # SwiGLU the bf16 kernel cannot fuse
    ("llama", "float32", "auto", {}, "int8"),                          # 8-bit block records
    ("qwen2", "bfloat16", "auto", {}, "int4"),                         # 4-bit block records, with biases
])
def test_native_stack_equals_the_python_layers(arch, dtype, kv_dtype, overrides, quantization, tmp_path):
    ran = _same(make_tiny_model(tmp_path / arch, arch, seed=3, **overrides), dtype, kv_dtype,
                quantization=quantization)
    assert ran["decode"] >= 10 and ran["chunks"] == 1 and ran["declined"] == 0  # the prompts' step too


def test_a_window_that_binds_a_chunk_keeps_the_python_layers(tmp_path):
    """Mistral with a window of 8: prompts of 40 and 23 tokens bind it (SDPA computes that step);
    decodes take the window in paged_decode."""
    ran = _same(make_tiny_model(tmp_path / "mistral", "mistral", seed=3, sliding_window=8), "float32")
    assert ran["decode"] >= 10 and ran["chunks"] == 0 and ran["declined"] == 1


@pytest.mark.parametrize("dtype,kv_dtype", [("bfloat16", "auto"), ("float32", "auto")])
def test_chunks_over_cached_context_beside_decodes(dtype, kv_dtype, tmp_path):
    """Chunked prefill (16 tokens a step): chunks read their earlier context from the cache (bf16 math
    over a bf16 cache), the short prompt decodes beside the long one's chunks."""
    folder = make_tiny_model(tmp_path / "llama", "llama", seed=5)
    ran = _same(folder, dtype, kv_dtype, max_num_batched_tokens=16)
    assert ran["chunks"] >= 4 and ran["mixed"] >= 1 and ran["decode"] >= 5 and ran["declined"] == 0


def test_prefix_hits_and_preemption(tmp_path):
    """A shared prefix (cached blocks: chunks start past context) and a cache too small for every request
    at once (a preempted request recomputes its prompt and generated tokens as one chunk, split where its
    prompt ends)."""
    folder = make_tiny_model(tmp_path / "llama", "llama", seed=6)
    prompts = [{"prompt_token_ids": TOKENS[:20] + TOKENS[i:i + 9]} for i in range(0, 40, 5)]
    params = SamplingParams(max_tokens=20, temperature=0, logprobs=2, ignore_eos=True)
    ran = _same(folder, "bfloat16", prompts=prompts, params=params, block_size=4, num_kv_blocks=40,
                enable_prefix_caching=True)
    assert ran["chunks"] >= 2 and ran["declined"] == 0
    python = _engine(folder, "bfloat16", block_size=4, num_kv_blocks=40, enable_prefix_caching=True)
    python.generate(prompts, params, use_tqdm=False)
    assert python.llm_engine.core.scheduler.num_preemptions > 0


@pytest.mark.parametrize("invariant", [False, True])
def test_speculative_verification(invariant, tmp_path):
    """Draft rows verified as chunks (their math stays float32), or, in batch-invariant mode, as decode
    rows (chunks of up to 16); a longer prompt chunk runs beside them (32 tokens a step), so decode_rows picks them out."""
    folder = make_tiny_model(tmp_path / "llama", "llama", seed=7)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    prompts = [{"prompt_token_ids": (TOKENS[:6] * 4)[:22]}, {"prompt_token_ids": TOKENS[10:30]}]
    try:
        ran = _same(folder, "bfloat16", prompts=prompts, speculative_config=spec, batch_invariant=invariant,
                    block_size=4, num_kv_blocks=64, max_num_batched_tokens=32)
    finally:
        cpu_ops.set_batch_invariant(False)  # process-wide: the engine leaves it on
    assert ran["chunks"] >= 1 and ran["mixed"] >= 1 and ran["declined"] == 0


@pytest.mark.parametrize("level", cpu_ops.LEVELS)
def test_native_stack_equals_the_python_layers_every_level(level, tmp_path):
    """Every kernel path this CPU runs (levels above it are capped to it): bf16 weights over a bf16 cache,
    chunked prefill beside decodes."""
    cpu_ops.set_isa(level)
    try:
        ran = _same(make_tiny_model(tmp_path / "llama", "llama", seed=4), "bfloat16", max_num_batched_tokens=16)
    finally:
        cpu_ops.set_isa("auto")
    assert ran["decode"] >= 5 and ran["chunks"] >= 4


def test_native_stack_takes_only_what_it_computes(tmp_path):
    """Formats and models the stack does not compute keep the Python layers: a quantized KV cache (the
    backend declines every step), per-head q/k norms (no stack at all), block weights read through an
    input permutation (GPTQ act-order: the C++ callers do not permute)."""
    llama = make_tiny_model(tmp_path / "llama", "llama", seed=3)
    ran = _run(_engine(llama, "float32", "int8"), native=True)[1]
    assert ran["decode"] == ran["chunks"] == 0 and ran["declined"] >= 10
    qwen3 = _engine(make_tiny_model(tmp_path / "qwen3", "qwen3", seed=3), "float32")
    assert NativeLayerStack.build(qwen3.llm_engine.runner.model) is None
    method = CheckpointBlockMethod(("qweight",), read=lambda tensors: None)
    layer = SimpleNamespace(records=torch.zeros(8), bits=4, bias=None, input_perm=torch.arange(32))
    assert method.native(layer) is None
    layer.input_perm = None
    assert method.native(layer).kind == 2


def test_forward_hooks_see_every_call(tiny_llm):
    """A hook on a layer's module (AWQ calibration's) sends the step through the Python layers."""
    model = tiny_llm.llm_engine.runner.model
    stack = NativeLayerStack.build(model)
    assert stack is not None and not stack._hooked()
    calls = []
    handle = model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda mod, args: calls.append(args[0].shape))
    try:
        assert stack._hooked()
        tiny_llm.generate([{"prompt_token_ids": TOKENS[:9]}], SamplingParams(max_tokens=3, ignore_eos=True),
                          use_tqdm=False)
    finally:
        handle.remove()
    assert [c[0] for c in calls] == [9, 1, 1] and not stack._hooked()


@pytest.mark.parametrize("value,decode_only", [("0", None), ("decode", True), ("1", False)])
def test_native_stack_environment(tiny_llm, monkeypatch, value, decode_only):
    monkeypatch.setenv("TOKENMILL_NATIVE_STACK", value)
    stack = NativeLayerStack.build(tiny_llm.llm_engine.runner.model)
    assert (stack is None) == (decode_only is None)
    assert stack is None or stack.decode_only == decode_only
