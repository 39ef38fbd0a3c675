"""What a start imports: heavy modules that a start does not use must stay out (each cost seconds of
every `tokenmill generate`, `serve` and test server; docs/BENCHMARKS.md, "Start-up time"). Checked
in fresh interpreters, by module name, not by time."""
import subprocess
import sys

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
print(" ".join(m for m in ("fastapi", "uvicorn", "starlette") if m in sys.modules))
"""


def _imported(code: str) -> str:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""


def test_a_default_model_start_and_step_import_no_dynamo_nor_sympy():
    # torch._dynamo came in through llguidance.torch (it calls torch.compile on import) and through
    # nn.Embedding's random init on the meta device (a constrained request may still import it);
    # sympy through to_empty's empty_like on meta tensors (torch._refs) and, with
    # torch.distributed.tensor, through AutoTokenizer's model-config load
    assert _imported(ENGINE) == ""


def test_the_cli_parser_imports_no_web_stack():
    assert _imported(PARSER) == ""


def test_the_default_models_tokenizer_is_autotokenizers_without_the_config_load():
    """load_tokenizer skips AutoTokenizer's config load for folders that name PreTrainedTokenizerFast:
    the same class, so the same tokens and chat prompt as AutoTokenizer gives."""
    from transformers import AutoTokenizer

    from tokenmill.engine.tokenizer import load_tokenizer
    from tokenmill.models.default_model import resolve_default_model
    folder = resolve_default_model()
    ours, auto = load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert type(ours) is type(auto)
    for text in ["Hello world, the capital of France", " spaces  and\ttabs\n", "<|im_start|>user ünïcødé 123"]:
        assert ours.encode(text) == auto.encode(text)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert (ours.eos_token_id, ours.bos_token_id) == (auto.eos_token_id, auto.bos_token_id)
