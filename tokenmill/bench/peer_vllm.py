"""Run a token-id workload through vLLM's offline `LLM.generate`: the peer side of benchmarks/compare_vllm.py.

This file is run by the python of vLLM's OWN virtualenv, never imported by tokenmill: vllm is not a
dependency of tokenmill, and this script imports nothing from it (stdlib + vllm only, and vllm only
inside functions, so that vLLM's spawned worker processes, which re-import this file, stay cheap).

    LD_PRELOAD=".../libtcmalloc_minimal.so.4:/opt/vllm-venv/lib/libiomp5.so" VLLM_CPU_OMP_THREADS_BIND=0-1 \\
    VLLM_CPU_KVCACHE_SPACE=4 /opt/vllm-venv/bin/python tokenmill/bench/peer_vllm.py --workload wl.json

Workload file (JSON): {"model": HF folder, "dtype": "float32"|"bfloat16",
                       "prompts": [[token ids], ...], "output_lens": [n, ...],
                       "engine_args": {extra keyword arguments of vllm.LLM, optional}}
Every request is a TokensPrompt with SamplingParams(max_tokens=n, temperature=0, ignore_eos=True).

Output: one JSON object per line on stdout, each prefixed by "PEER_VLLM_JSON " (vLLM logs to stdout too):
  {"event": "ready", "engine_start_s", "import_s", "vllm_version", "torch_version", ...}  after LLM() is built
  {"event": "result", "name": "vllm", "seconds", "num_requests", "prompt_tokens", "output_tokens", ...}
  {"event": "error", "error", "traceback"}
Timing covers `LLM.generate` only; engine start (LLM construction, including vLLM's torch.compile warm-up)
is reported separately in the ready event. The prefix cache is reset before every timed run, so a repeated
run of the same prompts does no less prefill work than the first.

Modes: by default, run the workload --repeats times and exit. With --stdin, build the engine, report ready,
then obey one command per line of stdin: "warmup" (the first 4 prompts, 8 tokens each), "run" (the
workload; "run ids" also returns the generated token ids), "quit" (or end of input). compare_vllm.py uses
this mode to alternate runs with tokenmill without paying vLLM's engine start more than once.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

# Python puts this script's folder (tokenmill/bench) first on sys.path; its modules would shadow
# packages vLLM's dependencies probe for (transformers imports a package named `kernels`).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

PREFIX = "PEER_VLLM_JSON "


def emit(obj: dict) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _version(dist_names: tuple[str, ...]) -> str | None:
    import importlib.metadata as md
    for name in dist_names:
        try:
            return f"{name} {md.version(name)}"
        except md.PackageNotFoundError:
            continue
    return None


class Peer:
    def __init__(self, wl: dict) -> None:
        t0 = time.perf_counter()
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        self.import_s = time.perf_counter() - t0
        self.SamplingParams, self.TokensPrompt = SamplingParams, TokensPrompt
        self.prompts: list[list[int]] = wl["prompts"]
        self.output_lens: list[int] = wl["output_lens"]
        if len(self.prompts) != len(self.output_lens):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.output_lens)} output lengths")
        longest = max(len(p) + n for p, n in zip(self.prompts, self.output_lens))
        self.engine_args = {"model": wl["model"], "dtype": wl.get("dtype", "float32"), "seed": 0,
                            "max_model_len": max(2048, longest), **wl.get("engine_args", {})}
        t0 = time.perf_counter()
        self.llm = LLM(**self.engine_args)
        self.engine_start_s = time.perf_counter() - t0

    def ready_event(self) -> dict:
        import torch
        return {"event": "ready", "engine_start_s": self.engine_start_s, "import_s": self.import_s,
                "vllm_version": _version(("vllm-cpu", "vllm")), "torch_version": torch.__version__,
                "torch_threads": torch.get_num_threads(), "engine_args": self.engine_args,
                "env": {k: v for k, v in os.environ.items()
                        if k.startswith(("VLLM_", "OMP_", "KMP_")) or k == "LD_PRELOAD"},
                "pid": os.getpid()}

    def _generate(self, prompts, output_lens) -> tuple[float, list]:
        params = [self.SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in output_lens]
        reqs = [self.TokensPrompt(prompt_token_ids=p) for p in prompts]
        start = time.perf_counter()
        outs = self.llm.generate(reqs, params, use_tqdm=False)
        return time.perf_counter() - start, outs

    def warmup(self) -> dict:
        k = min(4, len(self.prompts))
        seconds, _ = self._generate(self.prompts[:k], [8] * k)
        return {"event": "warmup", "seconds": seconds, "num_requests": k}

    def run(self, return_ids: bool = False) -> dict:
        reset = bool(self.llm.reset_prefix_cache())
        load = os.getloadavg()[0]
        seconds, outs = self._generate(self.prompts, self.output_lens)
        ids = [list(o.outputs[0].token_ids) for o in outs]
        produced = sum(map(len, ids))
        result = {"event": "result", "name": "vllm", "seconds": seconds, "num_requests": len(outs),
                  "prompt_tokens": sum(map(len, self.prompts)), "output_tokens": produced,
                  "requested_output_tokens": sum(self.output_lens), "prefix_cache_reset": reset,
                  "loadavg_1m_before": load}
        if return_ids:
            result["token_ids"] = ids
        return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True, help="JSON workload file (see above)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs (without --stdin)")
    p.add_argument("--warmup", action="store_true", help="one short warm-up before the timed runs")
    p.add_argument("--return-token-ids", action="store_true")
    p.add_argument("--stdin", action="store_true", help="take commands from stdin (see above)")
    args = p.parse_args(argv)
    try:
        with open(args.workload) as f:
            peer = Peer(json.load(f))
        emit(peer.ready_event())
        if not args.stdin:
            if args.warmup:
                emit(peer.warmup())
            for _ in range(args.repeats):
                emit(peer.run(args.return_token_ids))
            return 0
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "quit":
                break
            if cmd[0] == "warmup":
                emit(peer.warmup())
            elif cmd[0] == "run":
                emit(peer.run(return_ids="ids" in cmd[1:]))
            else:
                emit({"event": "error", "error": f"unknown command {line.strip()!r}"})
        return 0
    except Exception as e:  # noqa: BLE001 (reported as JSON so that the driver can show it)
        emit({"event": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return 1


if __name__ == "__main__":
    sys.exit(main())
