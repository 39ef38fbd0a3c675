"""Huge-page host memory (tokenmill/host_memory.py) and the weight arena (models/weight_arena.py):
buffers are zero, 2 MiB aligned and advised where the kernel has THP; gathering a model's weights
keeps every value, tie and Parameter, and the model computes exactly what it computed before."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tokenmill import host_memory
from tokenmill.host_memory import HUGE_PAGE, HUGE_PAGES_ENV, advise_huge, lazy_zeros, thp_mode
from tokenmill.malloc import find_tcmalloc
from tokenmill.models.weight_arena import _holders, gather_weights


@pytest.fixture(autouse=True)
def default_advice(monkeypatch):
    """The module tests the default (the suite's conftest turns the advice off for everyone else)."""
    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)


@pytest.fixture(scope="module")
def arena_llm(tiny_llama):
    """A tiny engine built under the default advice (the session's `tiny_llm` was built without it)."""
    from tokenmill import LLM
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(HUGE_PAGES_ENV, raising=False)
        return LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.02)


def _vma_flags(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds address."""
    fields: dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
                continue
            if inside:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    return fields


def test_lazy_zeros_is_zero_aligned_and_advised_where_the_kernel_allows():
    buf = lazy_zeros(3 * HUGE_PAGE + 12345)
    assert buf.dtype == torch.uint8 and buf.numel() == 3 * HUGE_PAGE + 12345
    assert buf.data_ptr() % HUGE_PAGE == 0
    assert int(buf[::4096].sum()) == 0 and int(buf[-1]) == 0
    if thp_mode() in ("always", "madvise"):
        assert _vma_flags(buf.data_ptr()).get("THPeligible") == "1"
    buf.fill_(7)  # writable, every page
    assert int(buf[HUGE_PAGE + 1]) == 7


_LAZY_AND_HUGE = """
import json, sys
from tokenmill.malloc import find_tcmalloc
from tokenmill.host_memory import HUGE_PAGE, lazy_zeros
sys.path.insert(0, {tests!r})
from test_host_memory import _vma_flags, _thp_fallbacks
fallbacks = _thp_fallbacks()
buf = lazy_zeros(4 * HUGE_PAGE + 1)
before = _vma_flags(buf.data_ptr())["Rss"]
buf.fill_(1)
after = _vma_flags(buf.data_ptr())
print(json.dumps({{"rss_before": before, "huge_after": after["AnonHugePages"],
                  "fallbacks": _thp_fallbacks() - fallbacks}}))
"""


def _thp_fallbacks() -> int:
    with open("/proc/vmstat") as f:
        return sum(int(v) for k, v in (line.split() for line in f) if k == "thp_fault_fallback")


@pytest.mark.parametrize("allocator", ["system", "tcmalloc"])
def test_lazy_zeros_maps_nothing_until_written_then_huge_pages_on_either_allocator(allocator):
    """tcmalloc's calloc memsets what it returns: buffers taken from it were mapped at once, in 4 KiB
    pages, before the advice (every engine process ran so, its weights and KV cache never huge)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TOKENMILL_HUGE_PAGES")}
    if allocator == "tcmalloc":
        if find_tcmalloc() is None:
            pytest.skip("no tcmalloc library on this machine")
        env["LD_PRELOAD"] = find_tcmalloc()
    code = _LAZY_AND_HUGE.format(tests=str(Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["rss_before"] == "0 kB", got  # nothing mapped before the first write
    if thp_mode() in ("always", "madvise") and got["fallbacks"] == 0:  # the kernel had huge pages to give
        assert int(got["huge_after"].split()[0]) >= 4 * HUGE_PAGE // 1024, got


def test_the_environment_switch_turns_the_advice_off(monkeypatch):
    monkeypatch.setenv(HUGE_PAGES_ENV, "0")
    assert not host_memory.huge_pages_wanted()
    buf = lazy_zeros(2 * HUGE_PAGE)
    assert not advise_huge(buf.data_ptr(), buf.numel())
    assert "off" in host_memory.describe()


@pytest.mark.parametrize("value,weights,kv", [(None, True, False), ("1", True, False), ("all", True, True),
                                               ("0", False, False)])
def test_the_kv_cache_is_advised_huge_only_with_all(monkeypatch, value, weights, kv):
    from tokenmill.attention.kv_cache import zeros
    if value is None:
        monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    else:
        monkeypatch.setenv(HUGE_PAGES_ENV, value)
    assert (host_memory.huge_pages_wanted(), host_memory.kv_huge_pages_wanted()) == (weights, kv)
    cache = zeros((2 * HUGE_PAGE // 4,), torch.float32)
    arena = lazy_zeros(2 * HUGE_PAGE)
    if thp_mode() == "madvise":  # under "always" every mapping is eligible anyway
        assert _vma_flags(cache.data_ptr())["THPeligible"] == str(int(kv))
        assert _vma_flags(arena.data_ptr())["THPeligible"] == str(int(weights))
    line = host_memory.describe()
    assert ("KV cache in 4 KiB pages" in line) == (weights and not kv and thp_mode() in ("always", "madvise"))


def test_advice_needs_a_whole_huge_page():
    buf = lazy_zeros(4 * HUGE_PAGE)
    assert not advise_huge(buf.data_ptr() + 4096, HUGE_PAGE)  # no whole 2 MiB page inside
    if thp_mode() in ("always", "madvise"):
        assert advise_huge(buf.data_ptr() + 4096, 2 * HUGE_PAGE)


@pytest.mark.parametrize("text,mode", [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"),
                                       ("always madvise [never]", "never"), ("", "unavailable")])
def test_thp_mode_reads_the_bracketed_policy(tmp_path, monkeypatch, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    monkeypatch.setattr(host_memory, "_THP_ENABLED", str(path))
    host_memory.thp_mode.cache_clear()
    try:
        assert host_memory.thp_mode() == mode
    finally:
        host_memory.thp_mode.cache_clear()


class _Head(nn.Module):
    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight  # tied
        self.packed = torch.randn(64, 300).to(torch.bfloat16)  # a plain attribute (packed panels)


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(500, 64)
        self.proj = nn.Linear(64, 256)
        self.norm = nn.LayerNorm(64)  # too small to move
        self.register_buffer("table", torch.arange(40000, dtype=torch.int64))
        self.head = _Head(self.embed.weight)
        self.meta = torch.empty(1000, 1000, device="meta")  # shape only
        whole = torch.randn(100, 300)
        self.part = whole[10:60]  # a view of a larger storage: left alone

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(ids))
        y = self.proj(h) @ self.head.packed.float()[:, :256].T
        return y + h @ self.head.weight[:64].T + self.table[:1].float() + self.part.sum()


def test_gather_keeps_values_ties_and_parameters():
    torch.manual_seed(0)
    model = _Toy().eval().requires_grad_(False)
    ids = torch.tensor([1, 7, 499])
    before = model(ids)
    old = {name: t.clone() for name, t in model.state_dict().items()}
    part_ptr = model.part.data_ptr()
    stats = gather_weights(model, min_bytes=16 << 10)
    assert stats.tensors == 4  # embedding (tied to head), proj.weight, table, head.packed
    assert model.head.weight is model.embed.weight and isinstance(model.embed.weight, nn.Parameter)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in _Toy().named_parameters()]
    for name, t in model.state_dict().items():
        assert torch.equal(t, old[name]), name
    moved = [model.embed.weight, model.proj.weight, model.table, model.head.packed]
    lo = min(t.data_ptr() for t in moved)
    assert lo % HUGE_PAGE == 0
    assert all(t.data_ptr() - lo < stats.bytes for t in moved)
    assert model.part.data_ptr() == part_ptr and model.meta.is_meta
    assert model.norm.weight.data_ptr() not in {t.data_ptr() for t in moved}
    assert torch.equal(model(ids), before)


def test_an_engine_holds_its_weights_in_one_arena(arena_llm):
    """build_model gathers: every large tensor of the loaded model lies in one 2 MiB-aligned span
    (correctness of the gathered model is what every reference test checks)."""
    model = arena_llm.llm_engine.runner.model
    big = {t.data_ptr(): t.numel() * t.element_size() for _, _, _, t in _holders(model)
           if not t.is_meta and t.layout == torch.strided and t.numel() * t.element_size() >= 64 << 10}
    assert len(big) >= 3
    lo, hi = min(big), max(p + n for p, n in big.items())
    assert lo % HUGE_PAGE == 0
    assert hi - lo < sum(big.values()) + 64 * len(big)  # packed back to back


def test_gathering_again_moves_the_arena_and_keeps_the_outputs(arena_llm):
    """The A/B of `python -m tokenmill.bench.host_pages`: re-gathered without the advice and back,
    the engine's weights move (the old arena is let go) and greedy tokens stay identical."""
    from tokenmill import SamplingParams
    model = arena_llm.llm_engine.runner.model
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": [11, 22, 33, 44]}, {"prompt_token_ids": [5, 6]}]
    before = [o.outputs[0].token_ids for o in arena_llm.generate(prompts, params, use_tqdm=False)]
    first = model.weight_arena
    plain = gather_weights(model, huge=False)
    assert plain.tensors == first.tensors and not plain.huge
    assert plain.buffer.data_ptr() != first.buffer.data_ptr()
    assert [o.outputs[0].token_ids for o in arena_llm.generate(prompts, params, use_tqdm=False)] == before
    again = gather_weights(model)
    assert again.tensors == first.tensors and model.weight_arena is again
    assert [o.outputs[0].token_ids for o in arena_llm.generate(prompts, params, use_tqdm=False)] == before


def test_prefault_maps_every_page_and_changes_no_byte():
    from tokenmill.attention.kv_cache import resident_bytes
    from tokenmill.host_memory import prefault
    tensors = [lazy_zeros(3 * HUGE_PAGE + 4096 * i + 100).view(torch.uint8) for i in range(4)]
    tensors[1][5], tensors[2][-1] = 9, 7  # written before
    done = prefault(tensors, threads=2, chunk_bytes=HUGE_PAGE)
    if not done.supported:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14): the pages stay lazy")
    assert done.mapped_bytes == sum(t.numel() for t in tensors)
    assert resident_bytes(tensors) >= sum(t.numel() for t in tensors)
    assert int(tensors[1][5]) == 9 and int(tensors[2][-1]) == 7
    assert sum(int(t.sum()) for t in tensors) == 16  # nothing else written
    assert prefault([]).mapped_bytes == 0


def prefault_supported() -> bool:
    from tokenmill.host_memory import prefault
    return prefault([lazy_zeros(4096)]).supported


def test_serve_prefaults_the_kv_cache_and_offline_engines_do_not(tiny_llama):
    from tokenmill import LLM
    from tokenmill.attention.kv_cache import resident_bytes
    from tokenmill.config import EngineConfig
    from tokenmill.server.cli_args import engine_config_from_args, make_parser
    assert not EngineConfig().kv_cache_prefault
    parser = make_parser()
    assert engine_config_from_args(parser.parse_args(["--model", str(tiny_llama)])).kv_cache_prefault
    assert not engine_config_from_args(parser.parse_args(["--model", str(tiny_llama),
                                                          "--no-kv-cache-prefault"])).kv_cache_prefault
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.05, kv_cache_prefault=True)
    runner = llm.llm_engine.runner

    def mapped() -> bool:
        tensors = [t for layer in runner.kv_caches for t in layer]
        return resident_bytes(runner.kv_caches) >= sum(t.numel() * t.element_size() for t in tensors)

    supported = prefault_supported()
    assert mapped() or not supported
    assert llm.generate(["hello there"], use_tqdm=False)[0].outputs[0].token_ids
    llm.llm_engine.sleep()
    assert not runner.kv_caches
    llm.llm_engine.wake_up()  # a fresh cache, mapped again
    assert runner.kv_caches and (mapped() or not supported)
