"""Fleet benchmark: device partitioning and SLA-routed pools, on this machine.

    python -m tokenmill.bench.fleet [--duration 30] [--out-json record.json]

Two small models (the default SmolLM2-135M-Instruct and a random-weight Llama of ~1/3 its compute,
built by the script with the same tokenizer) each get mixed traffic through one fleet endpoint:
interactive requests (Poisson arrivals, short prompts) and batch requests (closed loop, longer
prompts and outputs). Every scenario runs the same arrival draws for --duration seconds:

  time-sliced   one pool per model, no pinned cores: both engines share both cores (2 threads each)
  time-sliced-1t  the same with 1 thread per engine (the OS places them; no oversubscription)
  spatial       one pool per model, each pinned to its own core (1 thread each): the CPU analogue of MIG
  switching     one pool per model in one switch group: one engine awake at a time with both cores
                (2 threads), the other asleep (KV cache released, weights in host memory); turns after
                a 1 s quantum
  one-process   both models in ONE engine process (a `models:` pool, `tokenmill serve-multi`): one awake
                at a time with both cores (2 threads), the other asleep (KV cache released, weights in
                host memory), turns after a 1 s quantum; the fleet may send it 12 requests (6 per model,
                as the two pools of `switching` get)
  premium-only  the default model's traffic alone, on two replicas of the expensive profile ($4/h each)
  sla-routed    the same traffic on one premium replica ($4/h) + one economy replica ($0.5/h), routed by
                SLO class (batch takes idle capacity on the cheapest pool); TTFT/TPOT predicted from the
                pool's load (fleet/latency_model.py)
  sla-routed-ewma  the same with the first router's prediction (a moving average of recent requests)

Reported per scenario and SLO class: goodput (requests per second finishing within the class's
targets; batch: finished), p50/p99 TTFT and TPOT as the client sees them (streamed; the fleet's
queue and model switches included), and $/1M tokens from the
fleet's ledger: billed (device-seconds x price) and all-in (wall time x price of every replica,
idle included). On this CPU both hardware profiles are the same silicon: the profiles differ in
price only, so the premium-vs-routed difference is the routing's, not the hardware's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from tokenmill.bench.script import run_script, write_record
from tokenmill.disagg.launchers import wait_healthy
from tokenmill.fleet.metrics import percentile
from tokenmill.sse_reader import sse_lines

INTERACTIVE = {"ttft_ms": 500, "tpot_ms": 50}
KEYS = {"interactive": "KEY_I", "batch": "KEY_B"}


def build_small_model(out: Path, tokenizer_folder: Path) -> Path:
    """A random-weight Llama (hidden 384, 12 layers) with SmolLM2's tokenizer."""
    import torch
    import transformers
    folder = out / "small-llama"
    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=384, intermediate_size=1024, num_hidden_layers=12,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=2048,
                                   bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    for f in tokenizer_folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, folder / f.name)
    return folder


def pool(name: str, model: str, path: str | None, price: float, cores: list[int] | None, threads: int) -> dict:
    return {"name": name, "model": model, **({"path": path} if path else {}), "max_concurrency": 6,
            "hardware": {"name": name, "price_per_hour": price, "cores": cores},
            "engine": {"kv_cache_memory_gb": 0.2, "max_model_len": 1024, "num_threads": threads,
                       "disable_log_stats": True}}


def scenarios(small: Path) -> dict[str, tuple[list[dict], list[str]]]:
    """name -> (pools, models that get traffic)."""
    s = str(small)
    return {
        "time-sliced": ([pool("smollm2", "default", None, 1.0, None, 2), pool("small", "small", s, 1.0, None, 2)],
                        ["default", "small"]),
        "time-sliced-1t": ([pool("smollm2", "default", None, 1.0, None, 1), pool("small", "small", s, 1.0, None, 1)],
                           ["default", "small"]),
        "spatial": ([pool("smollm2", "default", None, 1.0, [0], 1), pool("small", "small", s, 1.0, [1], 1)],
                    ["default", "small"]),
        "switching": ([{**pool("smollm2", "default", None, 1.0, None, 2), "switch_group": "device"},
                       {**pool("small", "small", s, 1.0, None, 2), "switch_group": "device"}], ["default", "small"]),
        "one-process": ([{**pool("shared", "default", None, 1.0, None, 2), "model": None, "max_concurrency": 12,
                          "switch_quantum_s": 1.0, "models": [{"model": "default"}, {"model": "small", "path": s}]}],
                        ["default", "small"]),
        "premium-only": ([{**pool("premium", "default", None, 4.0, None, 1), "replicas": 2}], ["default"]),
        "sla-routed": ([pool("premium", "default", None, 4.0, [0], 1), pool("economy", "default", None, 0.5, [1], 1)],
                       ["default"]),
        "sla-routed-ewma": ([pool("premium", "default", None, 4.0, [0], 1),
                             pool("economy", "default", None, 0.5, [1], 1)], ["default"]),
    }


# fleet config beyond the pools, per scenario
SCENARIO_CONFIG = {"sla-routed-ewma": {"latency_prediction": "ewma"}}


@dataclass
class Result:
    slo_class: str
    ok: bool
    ttft_s: float | None = None
    tpot_s: float | None = None
    status: int = 0  # HTTP status; 0: no answer


@dataclass
class Traffic:
    duration: float
    interactive_rate: float  # requests/s per model
    batch_clients: int  # closed-loop clients per model
    seed: int = 0
    results: list[Result] = field(default_factory=list)


def _prompt(rng: random.Random, words: int) -> str:
    vocab = "the a of fleet token engine cost pool batch model core price queue cache step".split()
    return " ".join(rng.choice(vocab) for _ in range(words))


async def _one(client: httpx.AsyncClient, url: str, cls: str, model: str, prompt: str, max_tokens: int,
               out: list[Result]) -> None:
    """One streamed request; TTFT and TPOT as the client sees them (fleet queue and switches included)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.monotonic()
    first = last = None
    n_out = 0
    try:
        async with client.stream("POST", url + "/v1/completions", json=body,
                                 headers={"Authorization": f"Bearer {KEYS[cls]}"}) as r:
            if r.status_code != 200:
                await r.aread()
                out.append(Result(cls, False, status=r.status_code))
                return
            async for line in sse_lines(r):
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("choices"):
                    last = time.monotonic()
                    first = first or last
                if event.get("usage"):
                    n_out = event["usage"]["completion_tokens"]
    except httpx.HTTPError:
        out.append(Result(cls, False))
        return
    if first is None:
        out.append(Result(cls, False, status=200))
        return
    tpot = (last - first) / (n_out - 1) if n_out >= 2 else None
    out.append(Result(cls, True, first - start, tpot, 200))


async def drive(url: str, models: list[str], t: Traffic) -> None:
    rng = random.Random(t.seed)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        end = time.monotonic() + t.duration

        async def interactive(model: str, seed: int) -> None:
            r = random.Random(seed)
            tasks = []
            while True:
                await asyncio.sleep(r.expovariate(t.interactive_rate))
                if time.monotonic() >= end:
                    break
                tasks.append(asyncio.create_task(_one(client, url, "interactive", model, _prompt(r, 40), 32,
                                                      t.results)))
            await asyncio.gather(*tasks)

        async def batch(model: str, seed: int) -> None:
            r = random.Random(seed)
            while time.monotonic() < end:
                await _one(client, url, "batch", model, _prompt(r, 200), 96, t.results)

        jobs = [interactive(m, rng.randrange(1 << 30)) for m in models]
        jobs += [batch(m, rng.randrange(1 << 30)) for m in models for _ in range(t.batch_clients)]
        await asyncio.gather(*jobs)


def _meets(r: Result) -> bool:
    if r.slo_class != "interactive":
        return r.ok
    return (r.ok and r.ttft_s is not None and r.ttft_s * 1e3 <= INTERACTIVE["ttft_ms"]
            and (r.tpot_s is None or r.tpot_s * 1e3 <= INTERACTIVE["tpot_ms"]))


def run_scenario(name: str, pools: list[dict], models: list[str], args: argparse.Namespace, work: Path) -> dict:
    ledger = work / f"{name}.sqlite"
    cfg = {"pools": pools, "slo_classes": {"interactive": INTERACTIVE, "batch": {"max_queue_s": 600}},
           "tenants": {"app": {"api_key": KEYS["interactive"], "slo_class": "interactive"},
                       "jobs": {"api_key": KEYS["batch"], "slo_class": "batch"}},
           "ledger": str(ledger), "idle_cost_interval_s": 1.0, "max_queue": 1000, "switch_quantum_s": 1.0,
           **SCENARIO_CONFIG.get(name, {})}
    (work / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    port = 20000 + random.randrange(20000)
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "tokenmill", "fleet", "--config", str(work / f"{name}.yaml"),
                             "--port", str(port), "--log-dir", str(work / f"{name}-logs")],
                            stdout=open(work / f"{name}.log", "wb"), stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, lambda: None if proc.poll() is None else f"(the fleet) exited with {proc.returncode}", 300.0)
        t = Traffic(args.duration, args.interactive_rate, args.batch_clients, seed=args.seed)
        start = time.monotonic()
        asyncio.run(drive(url, models, t))
        elapsed = time.monotonic() - start
    finally:
        proc.terminate()
        proc.wait(60)
    return summarize(name, t.results, elapsed, ledger)




def summarize(name: str, results: list[Result], elapsed: float, ledger: Path) -> dict:
    out: dict = {"scenario": name, "elapsed_s": elapsed, "classes": {}}
    for cls in ("interactive", "batch"):
        rs = [r for r in results if r.slo_class == cls]
        ttft = [r.ttft_s for r in rs if r.ttft_s is not None]
        tpot = [r.tpot_s for r in rs if r.tpot_s is not None]
        out["classes"][cls] = {"requests": len(rs), "ok": sum(r.ok for r in rs),
                               "shed_429": sum(r.status == 429 for r in rs),
                               "goodput_rps": sum(_meets(r) for r in rs) / elapsed,
                               "slo_attainment": sum(_meets(r) for r in rs) / len(rs) if rs else None,
                               "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
                               "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99)}
    with sqlite3.connect(ledger) as conn:
        tokens, billed = conn.execute("SELECT SUM(prompt_tokens + completion_tokens), SUM(cost_usd) FROM requests"
                                      " WHERE status = 'ok'").fetchone()
        out_tokens = conn.execute("SELECT SUM(completion_tokens) FROM requests WHERE status = 'ok'").fetchone()[0]
        wall_cost, busy, wall = conn.execute("SELECT SUM(wall_seconds * price_per_hour / 3600.0), SUM(busy_seconds),"
                                             " SUM(wall_seconds) FROM pool_time").fetchone()
        by_pool = dict(conn.execute("SELECT pool, COUNT(*) FROM requests GROUP BY pool").fetchall())
    out.update(tokens=tokens, output_tokens=out_tokens, output_tokens_per_s=(out_tokens or 0) / elapsed,
               billed_usd=billed, wall_cost_usd=wall_cost, utilization=busy / wall if wall else None,
               usd_per_1m_tokens_billed=billed / tokens * 1e6 if tokens else None,
               usd_per_1m_tokens_all_in=wall_cost / tokens * 1e6 if tokens else None, requests_by_pool=by_pool)
    return out


def _fmt(v, digits=3) -> str:
    return "-" if v is None else f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def table(rows: list[dict]) -> str:
    head = ("| scenario | class | requests | goodput req/s | SLO met | TTFT p50 / p99 s | TPOT p50 / p99 ms | "
            "out tok/s (all) | $/1M tok billed | $/1M tok all-in | utilization |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        for cls, c in r["classes"].items():
            tpot = "/".join(_fmt(v * 1e3 if v is not None else None) for v in (c["tpot_p50_s"], c["tpot_p99_s"]))
            lines.append(f"| {r['scenario']} | {cls} | {c['requests']} | {_fmt(c['goodput_rps'])} | "
                         f"{_fmt(c['slo_attainment'])} | {_fmt(c['ttft_p50_s'])} / {_fmt(c['ttft_p99_s'])} | {tpot} | "
                         f"{_fmt(r['output_tokens_per_s'])} | {_fmt(r['usd_per_1m_tokens_billed'])} | "
                         f"{_fmt(r['usd_per_1m_tokens_all_in'])} | {_fmt(r['utilization'])} |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=30.0, help="seconds of traffic per scenario")
    p.add_argument("--interactive-rate", type=float, default=1.0, help="interactive requests/s per model")
    p.add_argument("--batch-clients", type=int, default=3, help="closed-loop batch clients per model")
    p.add_argument("--scenarios", default="time-sliced,time-sliced-1t,spatial,switching,one-process,premium-only,"
                   "sla-routed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None)
    p.add_argument("--out-json", default=None)


def run(args: argparse.Namespace) -> int:
    if len(os.sched_getaffinity(0)) < 2:
        print("needs 2 cores (the spatial scenarios pin to cores 0 and 1)", file=sys.stderr)
        return 2
    from tokenmill.models.default_model import resolve_default_model
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tokenmill-bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    small = build_small_model(work, resolve_default_model())
    all_scenarios = scenarios(small)
    rows = []
    for name in args.scenarios.split(","):
        pools, models = all_scenarios[name]
        rows.append(run_scenario(name, pools, models, args, work))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    write_record(args.out_json, results=rows, args=vars(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
