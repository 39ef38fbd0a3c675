"""Weight formats side by side on the default model: batch-1 decode against llama.cpp on the same
GGUF file, and resident memory after loading.

    python -m tokenmill.bench.quant [--threads 2] [--rounds 2] [--tokens 128]
                                    [--only decode|memory|gemm|w1] [--num-requests 48] [--json FILE]

decode  per-token decode time (TPOT) at batch 1, greedy, the same prompt, end of text banned so
        every run generates --tokens tokens: (time for 1 + N tokens - time for 1 token) / N, the
        best of 3 in each round, each engine in a fresh process, alternating order round by round:
          tokenmill gguf      the Q4_1 blocks kept (quantization="gguf", the default)
          tokenmill bf16/f32  dequantized at load (quantization="none", dtype auto / float32)
          llama.cpp           llama-cpp-python on the same .gguf, the same thread count
                              (skipped with a note when llama_cpp is not installed)
memory  resident set size of a fresh process after loading each format (minus the same process
        before loading), and the bytes the weights occupy.
gemm    one linear layer of the default model's shapes (gate_up 3072 x 576, down 576 x 1536) at
        batch 1 to 512 rows: block-quantized 4-bit records (int8 activations) against the float
        panels of the same layer, on every ISA path of this CPU (--only gemm for just this): the
        batch size from which dequantizing into a float GEMM would pay, if any.
w1      the offline W1 workload (--num-requests random-token prompts U[64,512], outputs
        U[32,256], greedy, ignore_eos; bench/offline.py) in every weight format of the default
        model (W1_FORMATS), each in a fresh process, order alternating round by round: output
        tok/s, and the load time beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from tokenmill.bench.offline import machine
from tokenmill.bench.script import run_script, write_record

PROMPT = "The history of the printing press begins"
FORMATS = {"tokenmill gguf": {"quantization": "gguf", "dtype": "auto"},
           "tokenmill bf16": {"quantization": "none", "dtype": "bfloat16"},
           "tokenmill f32": {"quantization": "none", "dtype": "float32"}}


# the same weights in each format the engine runs (int8 / int4: round to nearest at load from the
# dequantized GGUF, as a user gets with --quantization on a float model)
W1_FORMATS = {**FORMATS, "tokenmill int8": {"quantization": "int8", "dtype": "auto"},
              "tokenmill int4-g32": {"quantization": "int4", "dtype": "auto", "quant_group_size": 32}}


class TokenmillDecoder:
    def __init__(self, threads: int, **kwargs) -> None:
        from tokenmill import LLM
        self.llm = LLM(None, num_threads=threads, kv_cache_memory_gb=0.25, **kwargs)
        self.ids = self.llm.get_tokenizer().encode(PROMPT)

    def run(self, n: int) -> float:
        from tokenmill import SamplingParams
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        t0 = time.perf_counter()
        out = self.llm.generate([{"prompt_token_ids": self.ids}], params, use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == n
        return time.perf_counter() - t0


class LlamaCppDecoder:
    def __init__(self, threads: int, gguf_file: str) -> None:
        from llama_cpp import Llama
        self.llm = Llama(model_path=gguf_file, n_threads=threads, n_threads_batch=threads, n_ctx=1024, verbose=False)
        # end of text banned (SmolLM2: <|endoftext|> 0, <|im_end|> 2) so every run has its length
        self.banned = {tok: -1e9 for tok in {0, 2, self.llm.token_eos()}}

    def run(self, n: int) -> float:
        t0 = time.perf_counter()
        out = self.llm.create_completion(PROMPT, max_tokens=n, temperature=0.0, logit_bias=self.banned)
        assert out["usage"]["completion_tokens"] == n, out["usage"]
        return time.perf_counter() - t0


def tpot_ms(decoder, n: int) -> float:
    decoder.run(n)  # warm-up
    one = min(decoder.run(1) for _ in range(3))
    full = min(decoder.run(n + 1) for _ in range(3))
    return (full - one) / n * 1000


def decoders(threads: int) -> dict:
    from tokenmill.models.default_model import find_default_gguf
    out = {name: (lambda kw=kw: TokenmillDecoder(threads, **kw)) for name, kw in FORMATS.items()}
    try:
        import llama_cpp  # noqa: F401
        out["llama.cpp"] = lambda: LlamaCppDecoder(threads, str(find_default_gguf()))
    except ImportError:
        print("llama.cpp: llama_cpp not installed (pip install llama-cpp-python); skipped")
    return out


def measure_decode(threads: int, rounds: int, tokens: int) -> dict[str, list[float]]:
    """Each engine in a fresh process per round (an idle engine's or llama.cpp's spinning threads
    must not slow the next one), the order alternating round by round."""
    names = list(decoders(threads))
    results: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else reversed(names)):
            res = subprocess.run([sys.executable, "-m", "tokenmill.bench.quant", "--worker", name, "--threads",
                                  str(threads), "--tokens", str(tokens)], capture_output=True, text=True,
                                 env={**os.environ, "TQDM_DISABLE": "1"})
            if res.returncode:
                raise RuntimeError(f"{name}: {res.stderr[-2000:]}")
            results[name].append(json.loads(res.stdout.strip().splitlines()[-1])["tpot_ms"])
            print(f"round {r + 1}: {name:<16} {results[name][-1]:6.2f} ms/token", flush=True)
    return results


def measure_w1(threads: int, rounds: int, num_requests: int) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {name: [] for name in W1_FORMATS}
    for r in range(rounds):
        for name in (list(W1_FORMATS) if r % 2 == 0 else reversed(W1_FORMATS)):
            res = subprocess.run([sys.executable, "-m", "tokenmill.bench.quant", "--w1-worker", name, "--threads",
                                  str(threads), "--num-requests", str(num_requests)], capture_output=True, text=True,
                                 env={**os.environ, "TQDM_DISABLE": "1"})
            if res.returncode:
                raise RuntimeError(f"{name}: {res.stderr[-2000:]}")
            results[name].append(json.loads(res.stdout.strip().splitlines()[-1]))
            got = results[name][-1]
            print(f"round {r + 1}: {name:<20} {got['output_tokens_per_s']:7.1f} output tok/s "
                  f"({got['seconds']:.1f} s; load {got['load_s']:.1f} s)", flush=True)
    return results


def _w1_worker(name: str, threads: int, num_requests: int) -> int:
    from tokenmill import LLM
    from tokenmill.bench.offline import make_w1, run_tokenmill
    t0 = time.perf_counter()
    llm = LLM(None, num_threads=threads, max_num_seqs=128, max_num_batched_tokens=1024, **W1_FORMATS[name])
    load_s = time.perf_counter() - t0
    result = run_tokenmill(llm, make_w1(num_requests, llm.llm_engine.vocab_size, seed=0))
    print(json.dumps({**result.summary(), "load_s": load_s}))
    return 0


def _worker(name: str, threads: int, tokens: int) -> int:
    decoder = decoders(threads)[name]()
    print(json.dumps({"tpot_ms": tpot_ms(decoder, tokens)}))
    return 0


def measure_memory(threads: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, kw in FORMATS.items():
        code = ("import json, os, sys, torch\n"
                "from tokenmill.kernels import cpu_ops; cpu_ops.load()\n"
                "from tokenmill import LLM\n"
                "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
                "before = rss()\n"
                f"llm = LLM(None, num_threads={threads}, num_kv_blocks=16, **json.loads(sys.argv[1]))\n"
                "m = llm.llm_engine.runner.model\n"
                "seen, total = set(), 0\n"
                "for mod in m.modules():\n"
                "    for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)) + "
                "[getattr(mod, a) for a in ('records', 'packed') if isinstance(getattr(mod, a, None), torch.Tensor)]:\n"
                "        if t.device.type != 'meta' and id(t) not in seen:\n"
                "            seen.add(id(t)); total += t.numel() * t.element_size()\n"
                "print(json.dumps({'rss_mb': (rss() - before) / 1e6, 'weight_mb': total / 1e6}))\n")
        res = subprocess.run([sys.executable, "-c", code, json.dumps(kw)], capture_output=True, text=True,
                             env={**os.environ, "TQDM_DISABLE": "1"})
        if res.returncode:
            raise RuntimeError(f"{name}: {res.stderr[-2000:]}")
        out[name] = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"{name:<16} weights {out[name]['weight_mb']:7.1f} MB, RSS after loading +{out[name]['rss_mb']:7.1f} MB")
    return out


def measure_gemm(threads: int, reps: int = 30) -> list[dict]:
    import torch

    from tokenmill.kernels import cpu_ops
    from tokenmill.quant.blocks import pack, quantize_int4
    if not cpu_ops.load():
        print("gemm: C++ kernels unavailable; skipped")
        return []
    torch.set_num_threads(threads)
    levels = ["auto"] + (["avx2"] if cpu_ops.isa_level() != "avx2" else [])
    rows = []
    for n, k in ((3072, 576), (576, 1536)):
        w = torch.randn(n, k) * 0.05
        q4 = pack(quantize_int4(w, 32))
        bf16 = torch.ops.tokenmill.pack_bf16_panels(w.bfloat16())
        f32 = torch.ops.tokenmill.pack_panels(w)
        for level in levels:
            used = cpu_ops.set_isa(level)
            for m in (1, 8, 64, 512):
                x = torch.randn(m, k)
                t = {"q4": _best_us(lambda: torch.ops.tokenmill.q4_linear(x, q4, n, None), reps),
                     "bf16": _best_us(lambda: torch.ops.tokenmill.bf16_panel_linear(x, bf16, n, None), reps),
                     "f32": _best_us(lambda: torch.ops.tokenmill.panel_linear(x, f32, n, None), reps)}
                rows.append({"isa": used, "n": n, "k": k, "m": m, **{f"{key}_us": v for key, v in t.items()}})
                print(f"{used:<12} {n}x{k} M={m:<4} q4 {t['q4']:8.0f} us  bf16 {t['bf16']:8.0f} us  f32 {t['f32']:8.0f} us"
                      f"  q4/bf16 {t['q4'] / t['bf16']:.2f}  q4/f32 {t['q4'] / t['f32']:.2f}", flush=True)
        cpu_ops.set_isa("auto")
    return rows


def _best_us(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", choices=["decode", "memory", "gemm", "w1"], default=None)
    p.add_argument("--num-requests", type=int, default=48, help="w1: requests per run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--worker", default=None, help=__import__("argparse").SUPPRESS)  # one engine, in a subprocess
    p.add_argument("--w1-worker", default=None, help=__import__("argparse").SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.worker:
        return _worker(args.worker, args.threads, args.tokens)
    if args.w1_worker:
        return _w1_worker(args.w1_worker, args.threads, args.num_requests)
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; threads {args.threads}")
    want = (lambda part: args.only in (None, part))
    gemm = measure_gemm(args.threads) if want("gemm") else []
    memory = measure_memory(args.threads) if want("memory") and not args.skip_memory else {}
    decode = measure_decode(args.threads, args.rounds, args.tokens) if want("decode") else {}
    w1 = measure_w1(args.threads, args.rounds, args.num_requests) if want("w1") else {}
    if w1:
        base = max(r["output_tokens_per_s"] for r in w1["tokenmill f32"])
        print("\nW1 best output tok/s per format (vs float32):")
        for name, runs in w1.items():
            best_run = max(r["output_tokens_per_s"] for r in runs)
            print(f"  {name:<20} {best_run:7.1f}  {best_run / base:.2f}x")
    best = {name: min(v) for name, v in decode.items()}
    if best:
        print("\nbest TPOT per engine (ms/token):")
    for name, v in best.items():
        vs = f", {v / best['llama.cpp']:.2f}x llama.cpp" if "llama.cpp" in best else ""
        print(f"  {name:<16} {v:6.2f}{vs}")
    write_record(args.json, threads=args.threads, tokens=args.tokens, decode_ms=decode, best_ms=best, memory=memory,
                 gemm=gemm, w1=w1)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
