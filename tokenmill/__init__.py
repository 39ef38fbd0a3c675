"""tokenmill: an LLM inference engine whose first metric is the cost of a token under a latency SLO."""
from tokenmill import logger as _logger
from tokenmill.request import CompletionOutput, RequestOutput
from tokenmill.sampling_params import SamplingParams

_logger.configure()


def __getattr__(name: str):
    # LLM and LLMEngine pull in torch; import them lazily so torch-free users (sim/, bench) stay light.
    if name == "LLM":
        from tokenmill.llm import LLM
        return LLM
    if name == "LLMEngine":
        from tokenmill.engine.engine import LLMEngine
        return LLMEngine
    raise AttributeError(name)


__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput"]
