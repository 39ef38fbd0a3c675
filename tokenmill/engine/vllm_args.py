"""vLLM's `LLM(...)` arguments that have no EngineConfig field: code written for vLLM runs unchanged.

Each is mapped (kv_cache_memory_bytes, chat_template, generation_config), accepted when it asks
for what tokenmill does anyway, or refused when honouring it is impossible here (tensor
parallelism). One that would change behaviour but cannot is named in a warning, never silently
dropped."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tokenmill.sampling_params import MAX_LOGPROBS

logger = logging.getLogger(__name__)

# argument -> its vLLM default: other values are accepted with a warning that they do nothing here
_NO_EFFECT: dict[str, Any] = {
    "gpu_memory_utilization": 0.9,  # a GPU's share; the KV cache here: kv_cache_memory_gb
    "swap_space": 4,  # preempted requests are recomputed, never swapped
    "cpu_offload_gb": 0,
    "enforce_eager": False,  # no CUDA graphs to capture
    "disable_custom_all_reduce": False,
    "disable_log_stats": True,
    "tokenizer_mode": "auto",
    "trust_remote_code": False,  # no model code is downloaded or run: only the built-in architectures
    "revision": None,  # local folders only
    "tokenizer_revision": None,
    "hf_token": None,
    "compilation_config": None,
    "enable_chunked_prefill": True,  # always on
    "skip_tokenizer_init": False,
}
# must keep vLLM's default: one engine per process, no model parallelism on CPU
_ONE_DEVICE = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
GENERATION_CONFIG_MODES = ("auto", "vllm")


@dataclass
class LLMOptions:
    """What LLM itself keeps from vLLM's arguments."""
    chat_template: str | None = None
    generation_config: str = "auto"  # auto: the model's generation_config.json; vllm: SamplingParams' defaults


def split_vllm_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], LLMOptions]:
    """EngineConfig's keywords, and LLM's options, from LLM(**kwargs) written for vLLM."""
    kwargs = dict(kwargs)
    options = LLMOptions(chat_template=kwargs.pop("chat_template", None),
                         generation_config=kwargs.pop("generation_config", "auto"))
    if options.generation_config not in GENERATION_CONFIG_MODES:
        raise ValueError(f"generation_config must be one of {', '.join(GENERATION_CONFIG_MODES)} (a folder's "
                         f"generation_config.json is read from the model folder); got {options.generation_config!r}")
    for name in _ONE_DEVICE:
        value = kwargs.pop(name, 1)
        if value != 1:
            raise ValueError(f"{name} must be 1, got {value!r}: tokenmill runs one engine per process on CPU "
                             "(several engines: `tokenmill serve-multi` or `tokenmill cluster`)")
    if "kv_cache_memory_bytes" in kwargs:
        value = kwargs.pop("kv_cache_memory_bytes")
        if value is not None:
            kwargs.setdefault("kv_cache_memory_gb", value / 2**30)
    max_logprobs = kwargs.pop("max_logprobs", MAX_LOGPROBS)
    if max_logprobs != MAX_LOGPROBS:
        logger.warning("max_logprobs=%r is not supported: at most %d logprobs per token", max_logprobs, MAX_LOGPROBS)
    for name, default in _NO_EFFECT.items():
        if name in kwargs and kwargs.pop(name) != default:
            logger.warning("LLM(%s=...) has no effect in tokenmill (vLLM's default is %r)", name, default)
    return kwargs, options
