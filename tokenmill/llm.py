"""LLM: the offline API (names follow vLLM)."""
from __future__ import annotations

from typing import Sequence

from tqdm import tqdm

from tokenmill.config import EngineConfig
from tokenmill.engine.engine import LLMEngine
from tokenmill.request import CompletionOutput, FinishReason, RequestOutput
from tokenmill.sampling_params import SamplingParams

PromptType = str | list[int] | dict


class LLM:
    def __init__(self, model: str | None = None, **kwargs) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self.llm_engine.stream_outputs = False  # generate() returns final outputs only

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """A prompt that is invalid (too long, empty, ...) gets an output with `error` set and
        finish_reason "error"; the others are generated normally."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                 and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
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
                except ValueError as e:
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
             sampling_params: SamplingParams | None = None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.get_tokenizer()
        prompts = [{"prompt_token_ids": _chat_ids(tok, conv, chat_template, add_generation_prompt)}
                   for conv in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()


def _chat_ids(tok, conversation, chat_template, add_generation_prompt) -> list[int]:
    ids = tok.apply_chat_template(conversation, chat_template=chat_template, tokenize=True,
                                  add_generation_prompt=add_generation_prompt)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


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
    return RequestOutput(rid, text, ids, [CompletionOutput(0, "", [], finish_reason=FinishReason.ERROR.value)],
                         finished=True, error=message)
