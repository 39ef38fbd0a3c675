"""`tokenmill eval`: perplexity through prompt logprobs against transformers on the same windows,
and the exact-match scorer."""
from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

from tokenmill.cli import main
from tokenmill.data import read_text
from tokenmill.eval.exact_match import (DATASET, Item, extract_answer, is_match, load_items, normalize,
                                        run_exact_match)
from tokenmill.eval.perplexity import windows
from tokenmill.request import CompletionOutput, RequestOutput


def transformers_perplexity(folder, text: str, window: int, num_tokens: int) -> float:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok.encode(text, add_special_tokens=False)[:num_tokens]
    total, count = 0.0, 0
    with torch.no_grad():
        for w in windows(ids, window):
            lp = torch.log_softmax(model(torch.tensor([w])).logits[0].double(), dim=-1)
            total += lp[torch.arange(len(w) - 1), torch.tensor(w[1:])].sum().item()
            count += len(w) - 1
    return math.exp(-total / count)


def test_eval_perplexity_matches_transformers(tiny_llama, capsys, tmp_path):
    """Through the CLI, chunked prefill forced (a 100-token window over 32-token steps)."""
    out_json = tmp_path / "eval.json"
    assert main(["eval", str(tiny_llama), "--dtype", "float32", "--tasks", "perplexity", "--window", "100",
                 "--num-tokens", "350", "--max-num-batched-tokens", "32", "--kv-cache-memory-gb", "0.02",
                 "--output-json", str(out_json)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| model |") and lines[2].startswith("| ")
    record = json.loads(lines[-1])
    ppl = record["perplexity"]
    assert ppl["num_windows"] == 4 and ppl["num_tokens"] == 350 - 4
    ref = transformers_perplexity(tiny_llama, read_text(), 100, 350)
    assert math.isfinite(ppl["perplexity"])
    assert ppl["perplexity"] == pytest.approx(ref, rel=1e-4)
    assert json.loads(out_json.read_text())["perplexity"] == ppl


def test_windows():
    assert windows(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5]]  # a lone last token has nothing to score
    assert windows(list(range(8)), 3)[-1] == [6, 7]
    with pytest.raises(ValueError, match="window"):
        windows([1, 2], 1)


@pytest.mark.parametrize("output,answers,ok", [
    (" Paris", ["Paris"], True),
    ("paris.", ["Paris"], True),
    ("Answer: Buenos Aires\nQuestion: next", ["Buenos Aires"], True),
    ("\n 42 \n", ["42"], True),
    ("1,000", ["1000"], True),
    ("0.25", ["0.25"], True),
    ("025", ["0.25"], False),
    ("The Sun", ["the Sun", "Sun"], True),
    ("7 + 5 = 12", ["12"], False),
    ("The capital of France is Paris.", ["Paris"], False),
    ("apple banana cherry", ["apple, banana, cherry"], True),
    ("Xq7-Lm2", ["Xq7-Lm2"], True),
    ("Xq7 Lm2", ["Xq7-Lm2"], False),
    ("", ["a"], False),
    ("seven", ["7", "seven"], True),
])
def test_is_match(output, answers, ok):
    assert is_match(output, answers) is ok


def test_normalize_and_extract():
    assert normalize("  The  Cat sat, on the MAT!  ") == "cat sat on mat"
    assert normalize("3.5.") == "3.5"
    assert extract_answer("\n\nA: cold\nmore") == "cold"


def test_shipped_set():
    items = load_items()
    assert len(items) == 100 and len({it.id for it in items}) == 100
    assert {it.category for it in items} == {"arithmetic", "copy", "capital", "fact", "reasoning"}
    for it in items:
        assert it.question and it.answers and all(normalize(a) for a in it.answers), it.id
    assert DATASET.name == "exact_match.jsonl"


class _FixedLLM:
    """Returns given texts in order: the scorer's bookkeeping, without a model."""

    def __init__(self, texts: list[str]) -> None:
        self.texts, self.prompts = texts, None

    def generate(self, prompts, params, use_tqdm=False):
        self.prompts = prompts
        assert params.temperature == 0 and params.stop == ["\n"]
        return [RequestOutput(str(i), p, [], None, [CompletionOutput(0, t, [])], True)
                for i, (p, t) in enumerate(zip(prompts, self.texts))]


def test_run_exact_match_counts_by_category():
    items = [Item("a", "x", "What is 1 + 1?", ["2"]), Item("b", "x", "Capital of Peru?", ["Lima"]),
             Item("c", "y", "Repeat exactly: hi", ["hi"])]
    llm = _FixedLLM([" 2", " Cusco", " hi"])
    r = run_exact_match(llm, items, "few-shot")
    assert (r.correct, r.total, r.score) == (2, 3, 2 / 3)
    assert r.by_category == {"x": [1, 2], "y": [1, 1]}
    assert llm.prompts[0].endswith("Question: What is 1 + 1?\nAnswer:")
    with pytest.raises(ValueError, match="prompt_style"):
        run_exact_match(llm, items, "zero-shot")


def test_bad_tasks_is_a_one_line_error(capsys):
    assert main(["eval", "--tasks", "perplexity,bleu"]) == 2
    assert "--tasks must be a comma-separated list of perplexity, exact_match" in capsys.readouterr().err


def test_eval_passes_quantization_to_the_engine(tiny_llama, capsys):
    """--quantization reaches LLM(..., quantization=...): the record names the resolved method, and
    int8 weights move the perplexity a little but not far (a tiny random model; loose bound)."""
    args = ["eval", str(tiny_llama), "--dtype", "float32", "--tasks", "perplexity", "--window", "100",
            "--num-tokens", "200", "--kv-cache-memory-gb", "0.02"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(args + ["--quantization", "int8"]) == 0
    quant = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (plain["quantization"], quant["quantization"]) == ("none", "int8")
    ratio = quant["perplexity"]["perplexity"] / plain["perplexity"]["perplexity"]
    assert ratio != 1.0 and abs(ratio - 1) < 0.05


def test_prompt_logprobs_cost_benchmark_runs(tiny_llama, tmp_path, capsys):
    """The benchmark's bookkeeping (no timing is checked): three variants, a JSON record."""
    from tokenmill.bench import prompt_logprobs
    out = tmp_path / "cost.json"
    assert prompt_logprobs.main(["--model", str(tiny_llama), "--dtype", "float32", "--window", "64",
                                 "--num-tokens", "200", "--rounds", "1", "--k", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["plain", "prompt_logprobs=0", "prompt_logprobs=2"]
    assert all(r["wall_s"] >= r["executor_s"] > 0 for r in rows)
    assert "4 windows of 64" in capsys.readouterr().out
