"""The C++ decode stack (models/native_decode.py, kernels/csrc/decode_stack.cpp) against the Python
layers it replaces on pure decode steps: tolerance 0 (the same kernels on the same tensors, in the same
order), checked on every token's top log-probabilities, and on the KV cache both paths leave."""
import pytest
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.kernels import cpu_ops
from tokenmill.models.native_decode import NativeDecodeStack
from tiny_models import make_tiny_model

TOKENS = [3 + (i * 37) % 500 for i in range(60)]
# lengths 40 and 23 run past mistral's window of 8 below; 3 stays inside one KV block
PROMPTS = [{"prompt_token_ids": TOKENS[:40]}, {"prompt_token_ids": TOKENS[5:8]},
           {"prompt_token_ids": TOKENS[30:53]}]
SCORED = SamplingParams(max_tokens=12, temperature=0, logprobs=4, ignore_eos=True)


def _run(llm: LLM, native: bool) -> tuple[list, int, list[torch.Tensor]]:
    """(token ids and log-probabilities of each output, decode steps the stack ran, the KV caches) of a
    fresh engine (the same blocks in both runs)."""
    model = llm.llm_engine.runner.model
    stack = NativeDecodeStack.build(model) if native else None
    assert (stack is not None) == native
    ran = []
    if stack is not None:
        run = stack.run

        def counted(*args):
            out = run(*args)
            ran.append(out is not None)
            return out
        stack.run = counted
    model.__dict__["_native_stack"] = stack
    outs = llm.generate(PROMPTS, SCORED, use_tqdm=False)
    caches = [t.clone() for cache in llm.llm_engine.runner.kv_caches for t in cache]
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs], sum(ran), caches


def _engine(folder, dtype: str, kv_dtype: str = "auto", **kwargs) -> LLM:
    return LLM(str(folder), dtype=dtype, kv_cache_dtype=kv_dtype, num_kv_blocks=64, block_size=16,
               enable_prefix_caching=False, **kwargs)


@pytest.mark.parametrize("arch,dtype,kv_dtype,overrides", [
    ("llama", "float32", "auto", {}),                          # float32 panels, SiLU-mul op
    ("llama", "bfloat16", "auto", {}),                         # bf16 panels, fused SwiGLU, bf16 cache
    ("llama", "float32", "bfloat16", {}),                      # float32 weights over a bf16 cache
    ("qwen2", "bfloat16", "auto", {}),                         # q/k/v biases
    ("mistral", "float32", "auto", {"sliding_window": 8}),     # a window that binds
    ("llama", "bfloat16", "auto", {"intermediate_size": 80}),  # SwiGLU the bf16 kernel cannot fuse
])
def test_native_decode_equals_the_python_layers(arch, dtype, kv_dtype, overrides, tmp_path):
    folder = make_tiny_model(tmp_path / arch, arch, seed=3, **overrides)
    python, none, python_cache = _run(_engine(folder, dtype, kv_dtype), native=False)
    native, steps, native_cache = _run(_engine(folder, dtype, kv_dtype), native=True)
    assert none == 0 and steps >= 10  # the stack took the decode steps (prompt steps stay in Python)
    assert native == python
    assert all(torch.equal(a, b) for a, b in zip(native_cache, python_cache))


@pytest.mark.parametrize("level", cpu_ops.LEVELS)
def test_native_decode_equals_the_python_layers_every_level(level, tmp_path):
    """Every kernel path this CPU runs (levels above it are capped to it): bf16 weights over a bf16 cache."""
    cpu_ops.set_isa(level)
    try:
        folder = make_tiny_model(tmp_path / "llama", "llama", seed=4)
        python, _, python_cache = _run(_engine(folder, "bfloat16"), native=False)
        native, steps, native_cache = _run(_engine(folder, "bfloat16"), native=True)
    finally:
        cpu_ops.set_isa("auto")
    assert steps >= 10 and native == python
    assert all(torch.equal(a, b) for a, b in zip(native_cache, python_cache))


def test_native_decode_takes_only_what_it_computes(tmp_path):
    """Formats and models the stack does not compute keep the Python layers: a quantized KV cache (the
    backend declines the step), quantized weights and per-head q/k norms (no stack at all)."""
    llama = make_tiny_model(tmp_path / "llama", "llama", seed=3)
    assert _run(_engine(llama, "float32", "int8"), native=True)[1] == 0
    for folder, kwargs in [(llama, {"quantization": "int8"}),
                           (make_tiny_model(tmp_path / "qwen3", "qwen3", seed=3), {})]:
        assert NativeDecodeStack.build(_engine(folder, "float32", **kwargs).llm_engine.runner.model) is None


def test_native_decode_off_by_environment(tiny_llm, monkeypatch):
    monkeypatch.setenv("TOKENMILL_NATIVE_DECODE", "0")
    assert NativeDecodeStack.build(tiny_llm.llm_engine.runner.model) is None
