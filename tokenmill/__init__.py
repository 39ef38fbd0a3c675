"""tokenmill: an LLM inference engine whose first metric is the cost of a token under a latency SLO."""
from importlib.metadata import PackageNotFoundError, version

from tokenmill import logger as _logger
from tokenmill.request import CompletionOutput, RequestOutput
from tokenmill.sampling_params import BeamSearchParams, SamplingParams, StructuredOutputsParams

try:
    __version__ = version("tokenmill")
except PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0.0.0+unknown"

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


__all__ = ["__version__", "LLM", "LLMEngine", "SamplingParams", "BeamSearchParams", "StructuredOutputsParams", "RequestOutput",
           "CompletionOutput"]
