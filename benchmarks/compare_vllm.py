"""Offline W1 side by side: tokenmill (in this process) vs vLLM's CPU backend (in its own virtualenv).

    python benchmarks/compare_vllm.py [--num-requests 200] [--dtype auto] [--quantization none] \\
        [--peer-venv /opt/vllm-venv] [--json results.json]

The default model runs as its GGUF's Q4_1 blocks in tokenmill unless --quantization none; vLLM gets the
folder converted from that file (float weights). So the bf16-against-bf16 comparison is
`--quantization none`; a 4-bit comparison on the same weights is an AWQ folder for both
(`tokenmill quantize --method awq --group-size 64 --out DIR`, then `--model DIR`).

W1 is built by tokenmill.bench.offline.make_w1 (same seed, so the same prompts and output lengths for both
engines). Both engines get the same token-id prompts, greedy sampling, ignore_eos and max_tokens per request.
vLLM is driven by tokenmill/bench/peer_vllm.py run with the venv's python, kept alive between runs
(commands over stdin), with tcmalloc and the venv's libiomp5 preloaded and its OpenMP threads bound to every
core of this process (VLLM_CPU_OMP_THREADS_BIND), as vLLM's CPU docs advise; this process re-executes
itself with tcmalloc preloaded first, as `tokenmill` commands do (tokenmill/malloc.py; TOKENMILL_MALLOC=system
runs ours on glibc's malloc). Engine start is timed separately for both and never counted in throughput.

Order: ours, peer, ours, peer (--rounds 2), each engine's prefix cache reset before each run; the best run
of each engine is compared (output tokens/s ratio ours/peer). While one engine runs the other is idle; the
CPU time the idle one used meanwhile is recorded (idle_cpu_s) so that interference can be seen. An idle
vLLM is not quiet (its processes used 4.7-6.0 s of CPU per 250 s run of ours and made the kernel switch our
threads out 7-8x as often as with no vLLM alive: docs/BENCHMARKS.md), so by default its processes are
stopped (SIGSTOP) while ours runs and continued after (--no-pause-idle-peer: not); ours, idle, uses no CPU.

Both engines map their KV cache before the timed runs: vLLM allocates its cache at engine start, and ours
does so with --kv-cache-prefault (the default here, as for `tokenmill serve`; offline engines otherwise
map cache pages on first write). A first write to guest memory the hypervisor has taken back cost
69-75 us per 4 KiB page on machine C right after vLLM's start (2.5-4.4 us otherwise): 29 s of system time in
our first W1-200 round when the cache was mapped during the run. The mapping is timed in our engine start.
Without --peer-venv, or when vLLM is missing or fails to start, only tokenmill runs and the reason is printed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tokenmill.bench.offline import Result, machine, make_w1, print_table
from tokenmill.cpu import isa_flags

PEER_SCRIPT = REPO / "tokenmill" / "bench" / "peer_vllm.py"
PREFIX = "PEER_VLLM_JSON "


# ---------------------------------------------------------------- the peer (vLLM in its own venv)

class PeerUnavailable(RuntimeError):
    pass


def peer_python(venv: str) -> Path:
    py = Path(venv) / "bin" / "python"
    if not py.exists():
        raise PeerUnavailable(f"no python in the peer virtualenv: {py} does not exist")
    code = ("import importlib.util as u\n"
            "assert u.find_spec('vllm'), 'vllm is not installed in this virtualenv'\n")
    probe = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120, check=False)
    if probe.returncode != 0:
        raise PeerUnavailable(f"vLLM is not importable from {py}: {probe.stderr.strip().splitlines()[-1:]}")
    return py


def peer_env(venv: str, kvcache_gib: int, preload: bool) -> dict:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_list(sorted(os.sched_getaffinity(0))))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kvcache_gib))
    for name in ("PYTHONPATH", "LD_PRELOAD", "TOKENMILL_MALLOC_REEXECUTED"):  # nothing of ours leaks into vLLM's
        env.pop(name, None)
    if preload:
        from tokenmill.malloc import find_tcmalloc
        libs = [lib] if (lib := find_tcmalloc()) else []
        iomp = Path(venv) / "lib" / "libiomp5.so"
        if iomp.exists():
            libs.append(str(iomp))
        if libs:
            env["LD_PRELOAD"] = ":".join(libs)
    return env


def cpu_list(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the syntax of VLLM_CPU_OMP_THREADS_BIND)."""
    parts, start = [], None
    for i, c in enumerate(cores):
        start = c if start is None else start
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            parts.append(str(c) if c == start else f"{start}-{c}")
            start = None
    return ",".join(parts)


def tree_cpu_seconds(session_id: int) -> tuple[int, float]:
    """(count, user+system CPU seconds) of the live processes of a session (the peer and vLLM's children)."""
    tick = os.sysconf("SC_CLK_TCK")
    count, total = 0, 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session_id and fields[0] != "Z":  # after "comm": state ppid pgrp session ...
            count += 1
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return count, total / tick


class Peer:
    """peer_vllm.py --stdin in the vLLM venv; its JSON lines are events, everything else goes to a log."""

    def __init__(self, py: Path, workload_file: str, env: dict, log_path: str, start_timeout: float) -> None:
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen([str(py), str(PEER_SCRIPT), "--workload", workload_file, "--stdin"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     text=True, bufsize=1, start_new_session=True, cwd=tempfile.gettempdir())
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.ready = self.wait("ready", start_timeout)
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                self.events.put(json.loads(line[len(PREFIX):]))
            else:
                self.log.write(line)
                self.log.flush()
        self.events.put({"event": "exit"})

    def wait(self, kind: str, timeout: float) -> dict:
        try:
            ev = self.events.get(timeout=timeout)
        except queue.Empty:
            raise PeerUnavailable(f"no '{kind}' from vLLM within {timeout:.0f} s (log: {self.log.name})") from None
        if ev["event"] != kind:
            detail = ev.get("error") or f"process exited with code {self.proc.wait()}"
            raise PeerUnavailable(f"vLLM failed while waiting for '{kind}': {detail} (log: {self.log.name})")
        return ev

    def command(self, cmd: str, kind: str, timeout: float) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.wait(kind, timeout)

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.proc.pid)[1]

    @contextlib.contextmanager
    def paused(self, enabled: bool = True):
        """Stop vLLM's processes (SIGSTOP to its session's group) while ours runs; continue them after."""
        if not enabled or self.proc.poll() is not None:
            yield
            return
        os.killpg(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for sig in (15, 9):  # the peer's session: peer_vllm.py and the engine/worker processes vLLM spawned
            if tree_cpu_seconds(self.proc.pid)[0] == 0:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(5)
        if self.proc.poll() is None:
            self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------- ours

def run_ours(llm, wl, return_ids: bool) -> tuple[Result, dict]:
    from tokenmill import SamplingParams
    llm.reset_prefix_cache()
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in wl.output_lens]
    prompts = [{"prompt_token_ids": p} for p in wl.prompts]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    ids = [list(o.outputs[0].token_ids) for o in outs]
    produced = sum(map(len, ids))
    if produced != sum(wl.output_lens):
        print(f"warning: tokenmill produced {produced} tokens, {sum(wl.output_lens)} requested", file=sys.stderr)
    extra = {"loadavg_1m_before": load, "token_ids": ids if return_ids else None}
    return Result("tokenmill", seconds, len(outs), sum(map(len, wl.prompts)), produced), extra


def warmup_ours(llm, wl) -> float:
    from tokenmill import SamplingParams
    k = min(4, len(wl.prompts))
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in wl.prompts[:k]],
                 SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
    return time.perf_counter() - start


def agreement(ours: list[list[int]], peer: list[list[int]]) -> dict:
    """How far the two greedy outputs agree (informational: different kernels round differently)."""
    same, prefix = 0, []
    for a, b in zip(ours, peer):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same += a == b
        prefix.append(n / max(1, len(a)))
    return {"identical_requests": same, "requests": len(prefix),
            "mean_common_prefix_fraction": sum(prefix) / max(1, len(prefix))}


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# ---------------------------------------------------------------- main

def floor_report(engine, wl, dtype: str, best: list[Result]) -> dict:
    """W1's floor on this machine (tokenmill/bench/floor.py), measured after both engines ran, and
    how close each engine came to it."""
    import torch

    from tokenmill.bench.floor import workload_floor
    from tokenmill.bench.peaks import matmul_peak, peak_dtype, read_bandwidth
    peak = matmul_peak(peak_dtype(torch.bfloat16 if dtype == "bfloat16" else torch.float32))
    floor = workload_floor(engine.config.model.arch, wl, engine.runner.kv_bytes_per_token, peak, read_bandwidth())
    out = {**floor.summary(), "matmul_peak_gflops": peak,
           "of_floor": {r.name: r.output_tokens_per_s / floor.output_tok_s for r in best}}
    print(f"floor: {floor.output_tok_s:.0f} out tok/s ({floor.seconds:.1f} s: linear {floor.linear_s:.1f}, prefill "
          f"attention {floor.prefill_attention_s:.1f}, decode KV reads {floor.decode_kv_s:.1f}; matmul peak "
          f"{peak:.0f} GFLOP/s); " + ", ".join(f"{k} {v:.0%} of it" for k, v in out["of_floor"].items()))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF folder (default: tokenmill's default model folder)")
    p.add_argument("--quantization", default=None,
                   help="tokenmill's weight format (default: the model's own: gguf keeps the default model's Q4_1 "
                        "blocks; none = float weights in --dtype, what vLLM runs from the same folder; an awq folder "
                        "is read as awq by both engines)")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: tokenmill's choice for this CPU (bf16 only with AVX-512 bf16); vLLM gets the same")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (ours, peer) x rounds")
    p.add_argument("--max-num-seqs", type=int, default=128, help="tokenmill")
    p.add_argument("--max-num-batched-tokens", type=int, default=1024, help="tokenmill")
    p.add_argument("--threads", type=int, default=None, help="tokenmill intra-op threads (default: all cores)")
    p.add_argument("--kv-cache-prefault", action=argparse.BooleanOptionalAction, default=True,
                   help="tokenmill maps its KV cache at engine start, as vLLM does (default: on)")
    p.add_argument("--pause-idle-peer", action=argparse.BooleanOptionalAction, default=True,
                   help="stop vLLM's processes while tokenmill runs (default: on)")
    p.add_argument("--peer-venv", default=None, help="virtualenv with vLLM (e.g. /opt/vllm-venv)")
    p.add_argument("--peer-kvcache-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--peer-engine-args", default="{}", help='JSON of extra vllm.LLM kwargs, e.g. '
                   '\'{"max_num_seqs": 128, "max_num_batched_tokens": 1024}\'')
    p.add_argument("--peer-no-preload", action="store_true", help="do not LD_PRELOAD tcmalloc and libiomp5")
    p.add_argument("--peer-start-timeout", type=float, default=1800, help="seconds for vLLM's engine start")
    p.add_argument("--peer-run-timeout", type=float, default=3600, help="seconds for one vLLM run")
    p.add_argument("--peer-log", default=None, help="vLLM's log (default: a temp file)")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.num_requests < 1 or args.rounds < 1:
        p.error("--num-requests and --rounds must be >= 1")

    from tokenmill import LLM
    t0 = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype, quantization=args.quantization, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, num_threads=args.threads,
              kv_cache_prefault=args.kv_cache_prefault)
    ours_start_s = time.perf_counter() - t0
    engine = llm.llm_engine
    dtype = engine.config.model.dtype
    wl = make_w1(args.num_requests, engine.vocab_size, args.seed)
    print(f"W1: {args.num_requests} requests, {sum(map(len, wl.prompts))} prompt tokens, "
          f"{sum(wl.output_lens)} output tokens; dtype {dtype}; tokenmill weights "
          f"{engine.config.model.quantization}; tokenmill engine start {ours_start_s:.1f} s",
          flush=True)

    report: dict = {"machine": machine(), "cpu_flags_avx512": [f for f in isa_flags() if f.startswith(("avx512", "amx"))], "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                    "argv": sys.argv, "dtype": dtype, "model": engine.config.model.path,
                    "tokenmill_weights": engine.config.model.quantization,
                    "num_requests": args.num_requests, "seed": args.seed,
                    "prompt_tokens": sum(map(len, wl.prompts)), "output_tokens": sum(wl.output_lens),
                    "tokenmill": {"engine_start_s": ours_start_s, "max_num_seqs": args.max_num_seqs,
                                  "max_num_batched_tokens": args.max_num_batched_tokens,
                                  "threads": args.threads, "kv_cache_prefault": args.kv_cache_prefault},
                    "peer_paused_while_ours_runs": bool(args.pause_idle_peer and args.peer_venv),
                    "peer": None, "peer_unavailable": None, "runs": []}
    peer = None
    if args.peer_venv is None:
        report["peer_unavailable"] = "no --peer-venv given"
        print("vLLM: not run (no --peer-venv given); running tokenmill only", flush=True)
    else:
        try:
            py = peer_python(args.peer_venv)
            with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="w1_", delete=False) as wl_file:
                json.dump({"model": engine.config.model.path, "dtype": dtype, "prompts": wl.prompts,
                           "output_lens": wl.output_lens, "engine_args": json.loads(args.peer_engine_args)},
                          wl_file)
            log = args.peer_log or os.path.join(tempfile.gettempdir(),
                                                f"vllm_peer_{time.strftime('%Y%m%d_%H%M%S')}.log")
            env = peer_env(args.peer_venv, args.peer_kvcache_gib, not args.peer_no_preload)
            print(f"vLLM: starting {py} {PEER_SCRIPT.name} (log {log}; LD_PRELOAD={env.get('LD_PRELOAD', '')}, "
                  f"VLLM_CPU_OMP_THREADS_BIND={env['VLLM_CPU_OMP_THREADS_BIND']}, "
                  f"VLLM_CPU_KVCACHE_SPACE={env['VLLM_CPU_KVCACHE_SPACE']})", flush=True)
            peer = Peer(py, wl_file.name, env, log, args.peer_start_timeout)
            report["peer"] = {k: v for k, v in peer.ready.items() if k != "event"}
            report["peer"]["log"] = log
            print(f"vLLM: {peer.ready['vllm_version']} ready, engine start {peer.ready['engine_start_s']:.1f} s",
                  flush=True)
        except (PeerUnavailable, OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            report["peer_unavailable"] = str(e)
            print(f"vLLM: not run ({e}); running tokenmill only", flush=True)
            peer = None

    try:
        if not args.no_warmup:
            with peer.paused(args.pause_idle_peer) if peer else contextlib.nullcontext():
                report["tokenmill"]["warmup_s"] = warmup_ours(llm, wl)
            if peer:
                report["peer"]["warmup_s"] = peer.command("warmup", "warmup", args.peer_run_timeout)["seconds"]
        ours_runs, peer_runs, ours_ids, peer_ids = [], [], None, None
        for rnd in range(args.rounds):
            c0 = peer.cpu_seconds() if peer else None
            with peer.paused(args.pause_idle_peer) if peer else contextlib.nullcontext():
                res, extra = run_ours(llm, wl, return_ids=rnd == 0)
            ours_ids = extra.pop("token_ids") or ours_ids
            run = {"engine": "tokenmill", "round": rnd, **res.summary(), **extra}
            if peer:
                run["idle_cpu_s_of_other"] = peer.cpu_seconds() - c0
            ours_runs.append(res)
            report["runs"].append(run)
            print(f"round {rnd}: tokenmill {res.seconds:.1f} s, {res.output_tokens_per_s:.1f} out tok/s", flush=True)
            if peer:
                c0 = own_cpu_seconds()
                ev = peer.command("run ids" if rnd == 0 else "run", "result", args.peer_run_timeout)
                peer_ids = ev.pop("token_ids", None) or peer_ids
                pres = Result("vllm", ev["seconds"], ev["num_requests"], ev["prompt_tokens"], ev["output_tokens"])
                report["runs"].append({"engine": "vllm", "round": rnd, **pres.summary(),
                                       "prefix_cache_reset": ev["prefix_cache_reset"],
                                       "loadavg_1m_before": ev["loadavg_1m_before"],
                                       "idle_cpu_s_of_other": own_cpu_seconds() - c0})
                peer_runs.append(pres)
                print(f"round {rnd}: vllm      {pres.seconds:.1f} s, {pres.output_tokens_per_s:.1f} out tok/s",
                      flush=True)
    except (PeerUnavailable, OSError) as e:
        report["peer_unavailable"] = f"vLLM failed during the runs: {e}"
        print(f"vLLM: {e}", flush=True)
        peer_runs = []
    finally:
        if peer:
            peer.close()

    best = [min(ours_runs, key=lambda r: r.seconds)]
    if peer_runs:
        best.append(min(peer_runs, key=lambda r: r.seconds))
    print(f"\nmachine: {machine()}; date: {report['date']}; dtype {dtype}; best of {args.rounds} each")
    print_table(best)
    report["best"] = {r.name: r.summary() for r in best}
    report["floor"] = floor_report(engine, wl, dtype, best)
    if peer_runs:
        report["ratio_output_tokens_per_s_ours_over_peer"] = best[0].output_tokens_per_s / best[1].output_tokens_per_s
        if ours_ids and peer_ids:
            report["greedy_agreement"] = agreement(ours_ids, peer_ids)
            print(f"greedy outputs identical for {report['greedy_agreement']['identical_requests']}/"
                  f"{len(ours_ids)} requests")
    else:
        print(f"(vLLM not measured: {report['peer_unavailable']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    from tokenmill.malloc import reexec_with_tcmalloc
    reexec_with_tcmalloc("bench")  # our engine runs in this process: on tcmalloc, as `tokenmill` commands are
    sys.exit(main())
