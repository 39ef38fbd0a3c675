"""Exact match on a small shipped set (tokenmill/data/exact_match.jsonl: 100 short questions
written for this repository — arithmetic, copying, capitals, simple facts, small reasoning), greedy,
a few tokens per answer. The prediction is the first non-empty line of the output (a leading
"Answer:" dropped); it counts when it equals one of the item's answers after `normalize`."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokenmill.data import DATA_DIR
from tokenmill.sampling_params import SamplingParams

DATASET = DATA_DIR / "exact_match.jsonl"
PROMPT_STYLES = ("few-shot", "chat", "chat-few-shot")
INSTRUCTION = "Answer with only the answer: a number, a word or a short phrase, without explanation."
# worked examples (none of them is in the set)
EXAMPLES = [("What is 3 + 3?", "6"), ("What is the capital of Chile?", "Santiago"),
            ("Repeat exactly: green tea", "green tea"), ("How many wheels does a bicycle have?", "2")]


@dataclass(frozen=True)
class Item:
    id: str
    category: str
    question: str
    answers: list[str]


@dataclass
class ExactMatchResult:
    prompt_style: str
    correct: int
    total: int
    by_category: dict[str, list[int]] = field(default_factory=dict)  # category -> [correct, total]
    predictions: list[dict] = field(default_factory=list)  # id, prediction, correct

    @property
    def score(self) -> float:
        return self.correct / self.total if self.total else 0.0


def load_items(path: str | Path = DATASET) -> list[Item]:
    items = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").split("\n"), 1):  # JSON Lines (not splitlines)
        if line.strip():
            d = json.loads(line)
            try:
                items.append(Item(d["id"], d["category"], d["question"], list(d["answers"])))
            except KeyError as e:
                raise ValueError(f"{path}:{n}: item without {e.args[0]!r}") from None
    return items


_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize(text: str) -> str:
    """Lower case; thousands separators, periods (not decimal points), other punctuation but
    hyphens, and the articles a/an/the removed; whitespace collapsed."""
    t = text.strip().lower()
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t)
    t = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", t)
    t = re.sub(r"[^\w\s.\-]", " ", t)
    t = _ARTICLES.sub(" ", t)
    return " ".join(t.split())


def extract_answer(output: str) -> str:
    """The first non-empty line, without a leading "Answer:" or "A:"."""
    line = next((ln for ln in output.splitlines() if ln.strip()), "")
    return re.sub(r"^\s*(answer|a)\s*:\s*", "", line, flags=re.IGNORECASE).strip()


def is_match(output: str, answers: list[str]) -> bool:
    pred = normalize(extract_answer(output))
    return bool(pred) and any(pred == normalize(a) for a in answers)


def few_shot_prompt(question: str) -> str:
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in EXAMPLES)
    return f"{INSTRUCTION}\n\n{shots}Question: {question}\nAnswer:"


def chat_messages(question: str, with_examples: bool) -> list[dict]:
    msgs = [{"role": "system", "content": INSTRUCTION}]
    if with_examples:
        for q, a in EXAMPLES:
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return msgs + [{"role": "user", "content": question}]


def run_exact_match(llm, items: list[Item], prompt_style: str = "few-shot", max_tokens: int = 16) -> ExactMatchResult:
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {', '.join(PROMPT_STYLES)}, got {prompt_style!r}")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, stop=["\n"] if prompt_style == "few-shot" else None)
    if prompt_style == "few-shot":
        outs = llm.generate([few_shot_prompt(it.question) for it in items], params, use_tqdm=False)
    else:
        outs = llm.chat([chat_messages(it.question, prompt_style == "chat-few-shot") for it in items], params,
                        use_tqdm=False)
    result = ExactMatchResult(prompt_style, 0, len(items))
    for it, out in zip(items, outs):
        text = out.outputs[0].text
        ok = is_match(text, it.answers)
        result.correct += ok
        cat = result.by_category.setdefault(it.category, [0, 0])
        cat[0] += ok
        cat[1] += 1
        result.predictions.append({"id": it.id, "output": text, "correct": ok})
    return result
