"""Where does the time go, against what the machine can do: the floors of issue "CPU performance".

Measures in one run, with the engine's thread count:
  isa       the instruction-set paths our kernels chose on this CPU (kernels/csrc/cpu_isa.h)
  peak      large torch.matmul GFLOP/s (the matmul floor; float32's for bf16 weights on a CPU without
            AVX512_BF16, where they are widened to float32), our panel GEMM's own at 2048 x 2048 x 2048
            in the linear layers' format, and tensor-copy GB/s (the bandwidth floor)
  prefill   model FLOP/s during a prefill-only step, as a fraction of the matmul peak (MFU)
  decode    batch-1 decode: (weight + KV bytes read per token) / step time, as a fraction of copy GB/s
  overhead  at batch 64 decode: share of step time outside the model forward (scheduling, batch
            preparation, sampling, detokenization)
  cold      process start to the first token of the first request (a fresh subprocess)
  w1 floor  the W1-100 workload at the matmul peak and the read bandwidth (tokenmill/bench/floor.py):
            the output tok/s no engine can beat on this machine with these weights' FLOPs

    python -m tokenmill.bench.roofline [--dtype auto] [--quantization none] [--skip-cold-start]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from tokenmill.bench.script import run_script

_COLD = ("import time, sys; t0 = float(sys.argv[1]); from tokenmill import LLM, SamplingParams; "
         "llm = LLM(dtype=sys.argv[2]); "
         "o = llm.generate(['Hello'], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False); "
         "print('FIRST_TOKEN', time.time() - t0)")


def model_flops_per_token(cfg, context: float) -> float:
    """Matmul FLOPs of one token through the layers (no lm_head) plus attention at `context`."""
    h, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = 2 * cfg.hidden_size * (h + 2 * kv) + 2 * h * cfg.hidden_size \
        + 2 * cfg.hidden_size * 3 * cfg.intermediate_size
    attention = 4 * cfg.num_heads * cfg.head_dim * context
    return cfg.num_layers * (per_layer + attention)


def weight_bytes(model) -> int:
    """Bytes of weights read per decoded token: every parameter as stored (a packed linear weight
    in its packed dtype, block-quantized records as they are, not the shape-only placeholder left
    behind), except the embedding table (a few rows per token; a tied lm_head reads it whole,
    counted there)."""
    from tokenmill.models.linear import Linear
    total = 0
    for module in model.modules():
        if module is model.embed_tokens:
            continue
        packed = None
        if isinstance(module, Linear):
            packed = getattr(module, "packed", None)
            packed = getattr(module, "records", None) if packed is None else packed
        for name, p in module.named_parameters(recurse=False):
            stored = packed if name == "weight" and packed is not None else p
            total += stored.numel() * stored.element_size()
    return total


class _ForwardTimer:
    """Times the model forward: the layers and the lm_head of the sampled rows (compute_logits, or
    greedy_tokens where the head's argmax runs without logits)."""

    def __init__(self, model) -> None:
        self.seconds = 0.0
        for name in ("forward", "compute_logits", "greedy_tokens"):
            setattr(model, name, self._timed(getattr(model, name)))

    def _timed(self, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds += time.perf_counter() - t
            return out
        return timed


def _native_stack(model) -> str:
    """Which steps run all layers in one C++ call (models/native_stack.py): "all", "decode" or "none"."""
    build = getattr(model, "native_layer_stack", None)
    stack = build() if build is not None else None
    return "none" if stack is None else "decode" if stack.decode_only else "all"


def measure_prefill(llm, tokens_per_seq: int = 256, num_seqs: int = 4) -> dict:
    from tokenmill import SamplingParams
    engine = llm.llm_engine
    cfg = engine.config.model.arch
    for i in range(num_seqs):
        engine.add_request(f"p{i}", {"prompt_token_ids": [100 + i] * tokens_per_seq},
                           SamplingParams(max_tokens=1, temperature=0))
    engine.reset_prefix_cache()
    timer = _ForwardTimer(engine.runner.model)
    engine.step()
    for i in range(num_seqs):
        engine.abort_request(f"p{i}")
    tokens = tokens_per_seq * num_seqs
    flops = tokens * model_flops_per_token(cfg, tokens_per_seq / 2)
    return {"tokens": tokens, "seconds": timer.seconds, "gflops": flops / timer.seconds / 1e9}


def measure_decode(llm, batch: int, context: int = 256, steps: int = 8) -> dict:
    from tokenmill import SamplingParams
    engine = llm.llm_engine
    ids = [f"d{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, {"prompt_token_ids": [200 + i % 50] * context + [i]},
                           SamplingParams(max_tokens=steps + 64, temperature=0, ignore_eos=True))
    scheduler = engine.core.scheduler
    while scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running):
        engine.step()
    engine.step()
    timer = _ForwardTimer(engine.runner.model)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    total = time.perf_counter() - start
    for rid in ids:
        engine.abort_request(rid)
    return {"batch": batch, "step_s": total / steps, "forward_s": timer.seconds / steps,
            "overhead_share": 1 - timer.seconds / total}


def cold_start(dtype: str) -> float:
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", _COLD, str(t0), dtype], capture_output=True, text=True,
                         check=True)
    return float(next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("FIRST_TOKEN")))


def run(args: argparse.Namespace) -> int:
    import torch

    from tokenmill import LLM, host_memory
    from tokenmill.bench.offline import machine
    from tokenmill.bench.peaks import copy_bandwidth, matmul_peak, panel_gemm_peak, peak_dtype, read_bandwidth
    llm = LLM(dtype=args.dtype, quantization=args.quantization, max_num_batched_tokens=1024,
              enable_prefix_caching=False)
    engine = llm.llm_engine
    dtype = engine.runner.dtype
    from tokenmill.kernels import cpu_ops
    res: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "dtype": str(dtype),
                 "threads": torch.get_num_threads(), "isa": cpu_ops.isa(), "host_memory": host_memory.describe(),
                 "weights": engine.config.model.quantization,
                 "linear": type(engine.runner.model.lm_head.quant_method).__name__,
                 "native_stack": _native_stack(engine.runner.model)}
    res["matmul_peak_dtype"] = str(peak_dtype(dtype))
    res["matmul_peak_gflops"] = matmul_peak(peak_dtype(dtype))
    res["panel_gemm_peak_gflops"] = panel_gemm_peak(dtype)
    res["copy_gbps"] = copy_bandwidth()
    res["read_gbps"] = read_bandwidth()
    from tokenmill.bench.floor import workload_floor
    from tokenmill.bench.offline import make_w1
    res["w1_100_floor"] = workload_floor(engine.config.model.arch, make_w1(100, engine.vocab_size, 0),
                                         engine.runner.kv_bytes_per_token, res["matmul_peak_gflops"],
                                         res["read_gbps"]).summary()
    pre = measure_prefill(llm)
    res["prefill"] = {**pre, "mfu": pre["gflops"] / res["matmul_peak_gflops"],
                      "of_panel_peak": pre["gflops"] / res["panel_gemm_peak_gflops"]
                      if res["panel_gemm_peak_gflops"] else None}
    if engine.config.model.quantization not in (None, "none"):
        res["prefill"]["note"] = ("block-quantized weights multiply int8 codes (VNNI where the CPU has it): "
                                  "MFU is against the float matmul peak and can pass 1")
    one = measure_decode(llm, batch=1)
    ctx = 256 + 4
    bytes_per_token = weight_bytes(engine.runner.model) + ctx * engine.runner.kv_bytes_per_token
    res["decode_b1"] = {**one, "bytes_per_token": bytes_per_token,
                        "gbps": bytes_per_token / one["step_s"] / 1e9,
                        "bandwidth_util": bytes_per_token / one["step_s"] / 1e9 / res["copy_gbps"]}
    res["decode_b64"] = measure_decode(llm, batch=64)
    if not args.skip_cold_start:
        res["cold_start_s"] = cold_start(args.dtype)
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None, help="weight format (default: the model's own, gguf for the "
                   "default model; none = float weights in --dtype: the MFU against the matmul peak of that dtype)")
    p.add_argument("--skip-cold-start", action="store_true")
    p.add_argument("--json", default=None)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("roofline", help="prefill MFU, decode bandwidth, overhead, cold start")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
