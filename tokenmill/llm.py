"""LLM: the offline API (names follow vLLM)."""
from __future__ import annotations

import logging
from typing import Any, Sequence

from tqdm import tqdm

from tokenmill.beam_search import BeamSearchOutput, beam_search
from tokenmill.config import EngineConfig
from tokenmill.engine.chat_template import apply_chat_template, join_text_parts
from tokenmill.engine.engine import LLMEngine
from tokenmill.engine.vllm_args import split_vllm_kwargs
from tokenmill.inputs import PromptType
from tokenmill.request import CompletionOutput, FinishReason, RequestOutput
from tokenmill.sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger(__name__)


class LLM:
    def __init__(self, model: str | None = None, **kwargs) -> None:
        """`kwargs`: EngineConfig's fields, and vLLM's LLM arguments (engine/vllm_args.py)."""
        engine_kwargs, self.options = split_vllm_kwargs(kwargs)
        self.llm_engine = LLMEngine(EngineConfig(model=model, **engine_kwargs))
        self.llm_engine.stream_outputs = False  # generate() returns final outputs only
        self.llm_engine.clamp_max_tokens = True  # vLLM offline: the output ends at max_model_len
        if self.options.generation_config == "vllm":  # vLLM's: ignore the model's generation_config.json
            self.llm_engine.generation_defaults = {}
            self.llm_engine.extra_eos_ids = []

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() and chat() use when given no SamplingParams: the sampling keys of the
        model's generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty,
        max_new_tokens), else SamplingParams()'s own defaults, as vLLM."""
        return SamplingParams(**self.llm_engine.generation_defaults)

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """A prompt that is invalid (too long, empty, ...) gets an output with `error` set and
        finish_reason "error", and a warning in the log (vLLM raises for the whole batch); the others
        are generated normally."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                 and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or self.get_default_sampling_params()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
        _check_types(prompts, params)
        engine = self.llm_engine
        results: dict[str, RequestOutput] = {}
        order = []
        try:
            for prompt, p in zip(prompts, params):
                rid = engine.next_request_id()
                order.append(rid)
                try:
                    engine.add_request(rid, prompt, p)
                except ValueError as e:  # vLLM raises here; we answer the others and say so
                    logger.warning("prompt %d is refused (its output has error set): %s", len(order) - 1, e)
                    results[rid] = _error_output(rid, prompt, str(e))
        except BaseException:
            for rid in order:  # nothing stays queued when the batch fails
                engine.abort_request(rid)
            raise
        self._run(results, len(order), use_tqdm)
        return [results[rid] for rid in order]

    def _run(self, results: dict[str, RequestOutput], total: int, use_tqdm: bool) -> None:
        engine = self.llm_engine
        bar = tqdm(total=total, desc="generating", disable=not use_tqdm or None, initial=len(results))
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        bar.update(1)
        finally:
            bar.close()
            for rid in list(engine.parents):  # interrupted: leave the engine clean
                engine.abort_request(rid)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True,
             lora_request=None, chat_template: str | None = None, chat_template_content_format: str = "auto",
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             tools: list[dict] | None = None, chat_template_kwargs: dict[str, Any] | None = None,
             ) -> list[RequestOutput]:
        """vLLM's chat(): one conversation or a list of them, through the model's chat template
        (or `chat_template`). OpenAI-style text parts are joined into one string unless
        chat_template_content_format is "openai"; continue_final_message extends the last
        (assistant) message instead of opening a new one."""
        if lora_request is not None:
            raise ValueError("lora_request: LoRA adapters are not supported")
        if chat_template_content_format not in ("auto", "string", "openai"):
            raise ValueError("chat_template_content_format must be one of auto, string, openai; got "
                             f"{chat_template_content_format!r}")
        if continue_final_message and add_generation_prompt:
            add_generation_prompt = False  # vLLM refuses both; True is merely the default here
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        kwargs = dict(chat_template_kwargs or {})
        if continue_final_message:
            kwargs["continue_final_message"] = True
        template = chat_template if chat_template is not None else self.options.chat_template
        tok = self.get_tokenizer()
        prompts = []
        for conv in conversations:
            conv = conv if chat_template_content_format == "openai" else join_text_parts(list(conv))
            prompts.append({"prompt_token_ids": apply_chat_template(tok, conv, template, add_generation_prompt,
                                                                     kwargs, tools)})
        return self.generate(prompts, sampling_params, use_tqdm)

    def beam_search(self, prompts: Sequence[PromptType], params: BeamSearchParams,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's beam search (tokenmill/beam_search.py): the beam_width best sequences per prompt."""
        return beam_search(self, [self.llm_engine.tokenize_prompt(p)[1] for p in prompts], params)

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()


def _check_types(prompts: Sequence, params: Sequence) -> None:
    """Wrong types anywhere in the batch fail the whole call before anything is queued."""
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        if not isinstance(prompt, (str, list, tuple, dict)):
            raise TypeError(f"prompts[{i}] must be a string, a list of token ids or a dict with 'prompt' or "
                            f"'prompt_token_ids'; got {type(prompt).__name__}")
        if not isinstance(p, SamplingParams):
            raise TypeError(f"sampling_params[{i}] must be a SamplingParams; got {type(p).__name__}")


def _error_output(rid: str, prompt, message: str) -> RequestOutput:
    text = prompt if isinstance(prompt, str) else None
    ids = list(prompt) if isinstance(prompt, list) else []
    return RequestOutput(rid, text, ids, None, [CompletionOutput(0, "", [], finish_reason=FinishReason.ERROR.value)],
                         finished=True, error=message)
