"""Online, side by side: `tokenmill serve` then vLLM's OpenAI server (CPU backend, its own virtualenv),
each measured by `tokenmill bench serve` with the same workloads, request rates and seed, one after
the other in one run; then `tokenmill bench compare` per workload.

    python benchmarks/compare_vllm_serve.py --peer-venv /opt/vllm-venv [--dtype auto] \\
        [--workloads chat,long-short-mix] [--sweep 1,2,4] [--num-requests 60] [--out out/serve-vs-vllm] \\
        [--tokenmill-variant "--kv-cache-dtype int8" ...]

Each `--tokenmill-variant` adds one more tokenmill server, with those extra `serve` flags, measured in
the same run after the plain one (as `tokenmill-2`, `tokenmill-3`, ...) and compared with it.

Both servers get the default model's HF folder (tokenmill with `--quantization none`, so both run the
same float weights; `--model` an AWQ folder for 4-bit in both), the same dtype (auto: bfloat16 on AVX-512 CPUs,
as each engine decides; vLLM is given the dtype tokenmill resolved, so both compute in the same one, unless
`--peer-dtype` names another),
max_model_len the model's context length (--max-model-len: so long-short-mix's 4096-token prompts are served,
not refused), and both cores (vLLM: tcmalloc and libiomp5 preloaded, OpenMP threads bound to
this process's cores, 4 GiB KV cache, as its CPU docs advise; the flags are recorded in
vllm_flags.json). Server start-up is never measured. Prompts are text, exact lengths by the model's
tokenizer; `ignore_eos` is sent to both (both accept it).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.compare_vllm import PeerUnavailable, peer_env, peer_python  # noqa: E402


def wait_ready(base_url: str, proc: subprocess.Popen, timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{base_url}/v1/models", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"server not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench(base_url: str, workload: str, sweep: str, num_requests: int, tokenizer: str, out: Path) -> None:
    cmd = [sys.executable, "-m", "tokenmill.bench.serve", "serve", "--base-url", base_url, "--workload", workload,
           "--sweep", sweep, "--num-requests", str(num_requests), "--tokenizer", tokenizer, "--seed", "0",
           "--out", str(out), "--disable-tqdm"]
    subprocess.run(cmd, check=True, cwd=REPO)


def serve_and_bench(name: str, cmd: list[str], env: dict, port: int, args, tokenizer: str, log: Path,
                    start_timeout_s: float) -> dict:
    base_url = f"http://127.0.0.1:{port}"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            started = wait_ready(base_url, proc, start_timeout_s)
            print(f"{name}: ready in {started:.0f} s (not counted)", flush=True)
            for workload in args.workloads.split(","):
                bench(base_url, workload, args.sweep, args.num_requests, tokenizer, args.out / name / workload)
        finally:
            stop(proc)
    return {"start_s": started, "cmd": cmd}


def context_length(folder: str) -> int:
    return int(json.loads((Path(folder) / "config.json").read_text())["max_position_embeddings"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-venv", required=True)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--peer-dtype", default=None,
                   help="vLLM's dtype (default: the one tokenmill resolved); e.g. float32 on an AVX-512 CPU "
                        "without AVX512_BF16, where vLLM's bfloat16 is several times slower than its float32")
    p.add_argument("--model", default=None, help="HF folder for both servers (default: the default model's folder; "
                   "an AWQ folder from `tokenmill quantize --method awq --group-size 64` runs 4-bit in both)")
    p.add_argument("--quantization", default=None, help="tokenmill's weight format (default: none for the default "
                   "model, float weights as vLLM reads that folder; else the folder's own)")
    p.add_argument("--workloads", default="chat,long-short-mix")
    p.add_argument("--sweep", default="1,2,4")
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="both servers' max_model_len (default: the model's max_position_embeddings)")
    p.add_argument("--tokenmill-variant", action="append", default=[], metavar="FLAGS",
                   help="extra `tokenmill serve` flags for one more tokenmill server, e.g. \"--kv-cache-dtype int8\"")
    p.add_argument("--out", type=Path, default=Path("out") / f"serve-vs-vllm-{time.strftime('%Y%m%d-%H%M')}")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from tokenmill.engine.resolve import resolve_dtype
    from tokenmill.models.default_model import resolve_default_model
    folder = args.model or str(resolve_default_model())
    quantization = args.quantization or (None if args.model else "none")
    dtype = resolve_dtype(args.dtype)
    args.max_model_len = args.max_model_len or context_length(folder)
    try:
        vllm_py = peer_python(args.peer_venv)
    except PeerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    ours_cmd = [sys.executable, "-m", "tokenmill.cli", "serve", "--model", folder, "--port", "8011", "--dtype", dtype,
                "--max-model-len", str(args.max_model_len), "--disable-log-stats",
                *(["--quantization", quantization] if quantization else [])]
    peer_cmd = [str(vllm_py), "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--port", "8012",
                "--dtype", args.peer_dtype or dtype, "--max-model-len", str(args.max_model_len), "--seed", "0",
                "--disable-log-stats"]
    env_peer = peer_env(args.peer_venv, kvcache_gib=4, preload=True)
    record = {"date": time.strftime("%Y-%m-%d %H:%M"), "dtype": dtype, "peer_dtype": args.peer_dtype or dtype,
              "max_model_len": args.max_model_len, "argv": sys.argv, "model": folder,
              "tokenmill_quantization": quantization,
              "vllm_env": {k: env_peer[k] for k in ("LD_PRELOAD", "VLLM_CPU_OMP_THREADS_BIND",
                                                    "VLLM_CPU_KVCACHE_SPACE") if k in env_peer}}
    record["tokenmill"] = serve_and_bench("tokenmill", ours_cmd, dict(os.environ), 8011, args, folder,
                                          args.out / "tokenmill.log", 300)
    for i, flags in enumerate(args.tokenmill_variant, start=2):
        record[f"tokenmill-{i}"] = serve_and_bench(f"tokenmill-{i}", ours_cmd + shlex.split(flags), dict(os.environ),
                                                   8011, args, folder, args.out / f"tokenmill-{i}.log", 300)
    record["vllm"] = serve_and_bench("vllm", peer_cmd, env_peer, 8012, args, folder, args.out / "vllm.log", 900)
    (args.out / "vllm_flags.json").write_text(json.dumps(record, indent=2))
    others = [("vllm", "vLLM")] + [(f"tokenmill-{i}", f"tokenmill {flags}")
                                   for i, flags in enumerate(args.tokenmill_variant, start=2)]
    for workload in args.workloads.split(","):
        for name, label in others:
            print(f"\n=== {workload}: A = tokenmill, B = {label} ===", flush=True)
            subprocess.run([sys.executable, "-m", "tokenmill.bench.serve", "compare",
                            str(args.out / "tokenmill" / workload), str(args.out / name / workload)], cwd=REPO)
    return 0


if __name__ == "__main__":
    sys.exit(main())
