"""Flags of `tokenmill sim` (and, in part, `tokenmill plan`): the benchmark's workload flags, the
engine's scheduler and cache flags, and the cluster: where step times come from, replicas, roles."""
from __future__ import annotations

import argparse
import dataclasses

from tokenmill.config import EngineConfig
from tokenmill.routing.policies import POLICIES
from tokenmill.sim.cluster import KV_DTYPES, WEIGHT_DTYPES, ClusterConfig

_ENGINE = {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def add_model_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="Hugging Face model folder (its config.json gives the shape) (default: the "
                   "profile's model)")
    src = p.add_argument_group("performance model")
    src.add_argument("--profile", help="a profile JSON from `tokenmill sim profile` (default: the shipped CPU "
                     "profile of the default model, unless --hardware)")
    src.add_argument("--hardware", help="a device from the hardware profiles (h100, h200, a100, l40s, mi300x, "
                     "ascend910b; see tokenmill/sim/profiles/hardware.yaml) instead of a measured profile")
    src.add_argument("--hardware-file", help="your own hardware profiles YAML (default: the shipped one)")


def add_scheduler_args(p: argparse.ArgumentParser) -> None:
    """The engine flags the simulator honours (same names and defaults as `tokenmill serve`)."""
    eng = p.add_argument_group("engine")
    eng.add_argument("--max-num-batched-tokens", type=int, default=_ENGINE["max_num_batched_tokens"],
                     help="token budget of one engine step (default: %(default)s)")
    eng.add_argument("--max-num-seqs", type=int, default=_ENGINE["max_num_seqs"],
                     help="sequences running at once (default: %(default)s)")
    eng.add_argument("--max-model-len", type=int, default=8192, help="context length (default: %(default)s)")
    eng.add_argument("--long-prefill-token-threshold", type=int, default=0,
                     help="cap on one prompt's chunk per step, 0: none (default: %(default)s)")
    eng.add_argument("--one-prompt-end-per-step", action=argparse.BooleanOptionalAction, default=False,
                     help="a step that ends a prompt takes no other prompt's chunk, as `tokenmill serve` "
                          "schedules (default: off, prompts packed as vLLM does)")
    eng.add_argument("--block-size", type=int, default=_ENGINE["block_size"],
                     help="tokens per KV block (default: %(default)s)")
    eng.add_argument("--num-kv-blocks", type=int, help="KV blocks per replica (default: the profile's, or what "
                     "the device memory left after the weights holds)")
    eng.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                     help="reuse KV blocks of shared prefixes (default: on)")
    eng.add_argument("--no-continuous-batching", dest="continuous_batching", action="store_false",
                     help="request-level batching instead: a batch runs to its end before the next enters")
    eng.add_argument("--kv-cache-dtype", choices=KV_DTYPES, default="bfloat16", help="(default: %(default)s)")
    eng.add_argument("--weight-dtype", choices=WEIGHT_DTYPES, default="bfloat16",
                     help="weight storage: bytes read per step (default: %(default)s)")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("cluster")
    c.add_argument("--replicas", type=int, default=1, help="engine replicas (default: %(default)s)")
    c.add_argument("--tp", type=int, default=1, help="tensor-parallel devices per replica (default: %(default)s)")
    c.add_argument("--router", choices=tuple(POLICIES), default="least-loaded", help="(default: %(default)s)")
    c.add_argument("--prefill-replicas", type=int, default=0,
                   help="disaggregate: this many prefill replicas (with --decode-replicas)")
    c.add_argument("--decode-replicas", type=int, default=0, help="decode replicas of a disaggregated pool")
    c.add_argument("--decode-hardware", help="decode replicas on another device kind (a mixed pool)")
    c.add_argument("--link-gbps", type=float, help="KV transfer bandwidth, GB/s (default: the device "
                   "interconnect; 10 with a measured profile)")
    c.add_argument("--link-latency-ms", type=float, default=0.1, help="KV transfer latency (default: %(default)s)")
    e = p.add_argument_group("elastic P:D (the planner of `tokenmill cluster --planner profile`, simulated)")
    e.add_argument("--elastic", action="store_true", help="with --prefill-replicas/--decode-replicas as the start: "
                   "the profile planner moves replicas between the pools (its role profile from the same "
                   "performance model); prompts >= --min-remote-prefill-tokens go to the prefill pool")
    e.add_argument("--min-remote-prefill-tokens", type=int, default=256, help="(default: %(default)s)")
    e.add_argument("--planner-interval", type=float, default=5.0, help="seconds (default: %(default)s)")
    e.add_argument("--ttft-target-ms", type=float, default=2000.0, help="(default: %(default)s)")
    e.add_argument("--itl-target-ms", type=float, default=100.0, help="(default: %(default)s)")
    e.add_argument("--min-prefill", type=int, default=0, help="smallest prefill pool; 0 lets it empty (default: "
                   "%(default)s)")


def elastic_config(args: argparse.Namespace):
    """The simulated planner's settings, or None without --elastic."""
    if not getattr(args, "elastic", False):
        return None
    from tokenmill.disagg.sla_planner import SLAPlannerConfig
    if args.prefill_replicas < 1 or args.decode_replicas < 1:
        raise ValueError("--elastic needs --prefill-replicas and --decode-replicas >= 1 (the starting split)")
    return SLAPlannerConfig(interval_s=args.planner_interval, ttft_target_s=args.ttft_target_ms / 1e3,
                            itl_target_s=args.itl_target_ms / 1e3, min_prefill=args.min_prefill)


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    return ClusterConfig(
        replicas=args.replicas, tp=args.tp, prefill_replicas=args.prefill_replicas,
        decode_replicas=args.decode_replicas, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        one_prompt_end_per_step=args.one_prompt_end_per_step, block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching, num_kv_blocks=args.num_kv_blocks,
        weight_dtype=args.weight_dtype, kv_dtype=args.kv_cache_dtype, router=args.router,
        link_gbps=args.link_gbps, link_latency_s=args.link_latency_ms / 1000,
        decode_hardware=args.decode_hardware, continuous_batching=args.continuous_batching)
