"""What a start imports: heavy modules that a start does not use must stay out (each cost seconds of
every `tokenmill generate`, `serve` and test server; docs/BENCHMARKS.md, "Start-up time"). Checked
in fresh interpreters, by module name, not by time."""
import subprocess
import sys

import pytest

ENGINE = """
import sys
from tokenmill import LLM, SamplingParams
llm = LLM(kv_cache_memory_gb=0.05)  # the default model
llm.generate(["hello"], SamplingParams(max_tokens=2))
print(" ".join(m for m in ("torch._dynamo", "llguidance.torch", "sympy", "torch.distributed.tensor")
               if m in sys.modules))
"""

PARSER = """
import sys
from tokenmill.cli import build_parser
build_parser()
print(" ".join(m for m in ("torch", "safetensors", "transformers", "fastapi", "uvicorn", "starlette", "httpx")
               if m in sys.modules))
"""


TOKENIZERS = """
import sys
from tokenmill.engine.tokenizer import load_tokenizer
for folder in sys.argv[1:]:
    load_tokenizer(folder)
print(" ".join(m for m in ("transformers.models.auto.configuration_auto", "sympy", "torch.distributed.tensor")
               if m in sys.modules))
"""


def _imported(code: str, *args: str) -> str:
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""


def test_a_default_model_start_and_step_import_no_dynamo_nor_sympy():
    # torch._dynamo came in through llguidance.torch (it calls torch.compile on import) and through
    # nn.Embedding's random init on the meta device (a constrained request may still import it);
    # sympy through to_empty's empty_like on meta tensors (torch._refs) and, with
    # torch.distributed.tensor, through AutoTokenizer's model-config load
    assert _imported(ENGINE) == ""


def test_the_cli_parser_imports_no_torch_nor_web_stack():
    # the roofline and quantize flags used to import torch (~2.5 s of every `tokenmill` command,
    # `--version` and `--help` included); the serve-multi and router flags FastAPI; the benchmark
    # and simulator flags httpx (with click and rich), ~0.3 s
    assert _imported(PARSER) == ""


def _default_model_folder():
    from tokenmill.models.default_model import resolve_default_model
    return resolve_default_model()


def test_generic_fast_tokenizers_load_without_the_model_config(tiny_llama):
    # the default model's folder names PreTrainedTokenizerFast, the tiny one (saved by transformers 5)
    # TokenizersBackend; AutoTokenizer would load the model config for either (~1.5 s of imports)
    assert _imported(TOKENIZERS, str(_default_model_folder()), str(tiny_llama)) == ""


@pytest.mark.parametrize("which", ["default", "tiny"])
def test_the_tokenizer_is_autotokenizers_without_the_config_load(which, tiny_llama):
    """load_tokenizer skips AutoTokenizer's config load for folders that name the generic fast
    tokenizer: the same class, so the same tokens and chat prompt as AutoTokenizer gives."""
    from transformers import AutoTokenizer

    from tokenmill.engine.tokenizer import load_tokenizer
    folder = _default_model_folder() if which == "default" else tiny_llama
    ours, auto = load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert type(ours) is type(auto)
    for text in ["Hello world, the capital of France", " spaces  and\ttabs\n", "<|im_start|>user ünïcødé 123"]:
        assert ours.encode(text) == auto.encode(text)
    assert auto.chat_template is not None  # both folders carry one: the prompts below are compared
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert (ours.eos_token_id, ours.bos_token_id) == (auto.eos_token_id, auto.bos_token_id)
