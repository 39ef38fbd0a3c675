"""MoE and MLA on tiny random-weight models built by this script (hidden 512, 8 layers, the
SmolLM2 tokenizer), every comparison in the same run:

- throughput (output and total tok/s) and KV bytes per token: a dense Llama (GQA, 8 heads, 2 KV
  heads, MLP 2048), a Mixtral-style MoE with the same attention (8 experts of 1024, top-2: the same
  active MLP width as the dense one) and a DeepSeek-V2-style MLA model (16 heads, latent 128 + RoPE
  key 32, dense MLP 2048);
- MLA caching the latent vs caching decompressed per-head K/V, at the same KV budget: sequences
  admitted (peak running), preemptions, tok/s; the latent with our paged decode kernel and both
  with the PyTorch path (attention_backend torch) so the cache layout is the only difference;
- expert load on the shipped text (tokenmill/data, Alice chapters I-II): tokens per expert per
  layer and the imbalance max/mean per layer (random router weights, so this is the router of a
  random model on real token statistics, not a trained router's imbalance);
- expert parallelism: 2 processes (gloo all-to-all, 1 thread each) vs 1 process with 1 and with 2
  threads, same requests, outputs checked identical.

    flock /tmp/tokenmill-bench.lock python -m tokenmill.bench.moe_mla [--num-requests 16]
        [--prompt-len 128] [--max-tokens 64] [--json out.json]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenmill.bench.script import run_script, write_record

DIMS = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            max_position_embeddings=4096, tie_word_embeddings=False)


def build_models(out: Path, vocab_size: int, tokenizer_folder: Path) -> dict[str, Path]:
    """dense (Llama), moe (Mixtral), mla (DeepSeek-V2 attention, dense MLPs), random weights."""
    import torch
    import transformers
    torch.manual_seed(0)
    base = dict(DIMS, vocab_size=vocab_size, bos_token_id=1, eos_token_id=2)
    configs = {
        "dense": transformers.LlamaConfig(**base, intermediate_size=2048),
        "moe": transformers.MixtralConfig(**base, intermediate_size=1024, num_local_experts=8, num_experts_per_tok=2),
        "mla": transformers.DeepseekV2Config(**{**base, "num_attention_heads": 16, "num_key_value_heads": 16},
                                             intermediate_size=2048, kv_lora_rank=128, q_lora_rank=None,
                                             qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                                             first_k_dense_replace=8, n_routed_experts=8, num_experts_per_tok=2,
                                             moe_intermediate_size=256, n_shared_experts=1),
    }
    folders = {}
    for name, cfg in configs.items():
        folder = out / name
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
        for f in tokenizer_folder.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
                shutil.copy(f, folder / f.name)
        folders[name] = folder
    return folders


def text_prompts(tokenizer_folder: Path, n: int, length: int) -> list[list[int]]:
    """n windows of `length` tokens of the shipped text, evenly spaced."""
    from transformers import AutoTokenizer

    from tokenmill.data import read_text
    ids = AutoTokenizer.from_pretrained(tokenizer_folder)(read_text())["input_ids"]
    step = max(1, (len(ids) - length) // max(1, n - 1))
    return [ids[i * step:i * step + length] for i in range(n)]


@dataclass
class Run:
    name: str
    seconds: float
    prompt_tokens: int
    output_tokens: int
    kv_bytes_per_token: float
    num_kv_blocks: int
    peak_running: int
    preemptions: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds

    def summary(self) -> dict:
        return {**asdict(self), "output_tokens_per_s": self.output_tokens_per_s,
                "total_tokens_per_s": self.total_tokens_per_s}


def run_engine(name: str, folder: Path, prompts: list[list[int]], max_tokens: int, **engine_kwargs):
    """Returns (Run, outputs, engine)."""
    from tokenmill import LLM, SamplingParams
    llm = LLM(str(folder), **engine_kwargs)
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0][:16]}], SamplingParams(max_tokens=2, temperature=0),
                 use_tqdm=False)  # warm-up
    engine.runner.expert_load.tokens.clear()
    preempt0 = engine.core.scheduler.num_preemptions
    for i, p in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": p}, params)
    outs, peak = {}, 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0].token_ids
        peak = max(peak, len(engine.core.scheduler.running))
    seconds = time.perf_counter() - t0
    tokens = [outs[str(i)] for i in range(len(prompts))]
    run = Run(name, seconds, sum(map(len, prompts)), sum(map(len, tokens)), engine.config.cache.bytes_per_token,
              engine.config.cache.num_blocks, peak, engine.core.scheduler.num_preemptions - preempt0)
    print(f"{name:<34} {seconds:7.2f}s {run.output_tokens_per_s:8.1f} out tok/s {run.total_tokens_per_s:8.1f} "
          f"tok/s  KV {run.kv_bytes_per_token:7.0f} B/token  blocks {run.num_kv_blocks:5d}  peak running {peak:3d}"
          f"  preemptions {run.preemptions}", flush=True)
    return run, tokens, engine


def mla_budget_runs(folder: Path, prompts, max_tokens: int, budget_gb: float) -> list[Run]:
    from tokenmill.models.deepseek import DeepseekV2ForCausalLM
    from tokenmill.models.registry import _registered, register_model
    kw = dict(dtype="float32", kv_cache_memory_gb=budget_gb, max_num_seqs=len(prompts))
    runs = []
    latent_cpu, ref, _ = run_engine("mla latent, cpu kernel", folder, prompts, max_tokens, **kw)
    latent_torch, t1, _ = run_engine("mla latent, torch", folder, prompts, max_tokens, attention_backend="torch",
                                     **kw)
    register_model("DeepseekV2ForCausalLM", type("DecompressedKV", (DeepseekV2ForCausalLM,),
                                                 {"decompressed_cache": True}))
    try:
        decompressed, t2, _ = run_engine("mla decompressed K/V, torch", folder, prompts, max_tokens,
                                         attention_backend="torch", **kw)
    finally:
        _registered.pop("DeepseekV2ForCausalLM")
    runs += [latent_cpu, latent_torch, decompressed]
    same = ref == t1 == t2
    print(f"MLA outputs identical across cache layouts: {same}")
    return runs, same


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--mla-budget-gb", type=float, default=0.05,
                   help="KV budget of the latent-vs-decompressed comparison (small, so the cache limits admission)")
    p.add_argument("--json", default=None)


def run(args: argparse.Namespace) -> int:
    from tokenmill.bench.ep_launch import generate_expert_parallel
    from tokenmill.models.default_model import resolve_default_model
    tok = resolve_default_model()
    with tempfile.TemporaryDirectory(prefix="tokenmill-moe-mla-") as tmp:
        from transformers import AutoTokenizer
        vocab = len(AutoTokenizer.from_pretrained(tok))
        folders = build_models(Path(tmp), vocab, tok)
        prompts = text_prompts(tok, args.num_requests, args.prompt_len)
        n, m = args.num_requests, args.max_tokens
        print(f"{n} requests, {args.prompt_len}-token prompts from the shipped text, {m} output tokens, float32")
        kw = dict(dtype="float32", max_num_seqs=n)
        dense, _, _ = run_engine("dense (llama, GQA)", folders["dense"], prompts, m, **kw)
        moe, moe_tokens, moe_engine = run_engine("moe (mixtral 8x top-2, GQA)", folders["moe"], prompts, m, **kw)
        load = moe_engine.runner.expert_load.summary()
        mla, _, _ = run_engine("mla (deepseek-v2 attention)", folders["mla"], prompts, m, **kw)
        budget_runs, mla_same = mla_budget_runs(folders["mla"], prompts, m, args.mla_budget_gb)
        for layer in load["layers"]:
            print(f"expert load layer {layer['layer']}: {layer['tokens_per_expert']} "
                  f"imbalance {layer['imbalance_max_over_mean']:.2f}")
        one_thread, one_tokens, _ = run_engine("moe, 1 process x 1 thread", folders["moe"], prompts, m,
                                               num_threads=1, **kw)
        two_threads, _, _ = run_engine("moe, 1 process x 2 threads", folders["moe"], prompts, m, num_threads=2, **kw)
        t0 = time.perf_counter()
        ranks = generate_expert_parallel(str(folders["moe"]), prompts, m, world=2, num_threads=1, **kw)
        wall = time.perf_counter() - t0
        ep_seconds = max(r["seconds"] for r in ranks)
        ep_same = all(r["tokens"] == one_tokens for r in ranks)
        out_tokens = sum(map(len, ranks[0]["tokens"]))
        print(f"moe, 2 processes x 1 thread (EP)   {ep_seconds:7.2f}s {out_tokens / ep_seconds:8.1f} out tok/s "
              f"(launch + build + run {wall:.1f}s); outputs identical to 1 process: {ep_same}")
    ep = {"seconds": ep_seconds, "output_tokens": out_tokens, "output_tokens_per_s": out_tokens / ep_seconds,
          "identical_to_single_process": ep_same}
    write_record(args.json, requests=n, prompt_len=args.prompt_len, max_tokens=m,
                 throughput=[r.summary() for r in (dense, moe, mla)],
                 mla_same_budget={"kv_cache_memory_gb": args.mla_budget_gb, "outputs_identical": mla_same,
                                  "runs": [r.summary() for r in budget_runs]},
                 expert_load=load,
                 expert_parallel={"single_1_thread": one_thread.summary(), "single_2_threads": two_threads.summary(),
                                  "two_processes_1_thread_each": ep})
    return 0 if ep_same and mla_same else 1


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
