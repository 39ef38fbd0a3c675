"""Run one generation with experts split over N local processes (torch.distributed, gloo on
loopback): each process builds the same engine, joins the expert-parallel group, and generates the
same requests; the experts of every MoE layer are divided between them and tokens travel by
all-to-all (tokenmill/models/expert_parallel.py). Used by the test and the MoE benchmark."""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, folder: str, prompts: list[list[int]], max_tokens: int,
            engine_kwargs: dict, out_dir: str) -> None:
    import torch.distributed as dist

    from tokenmill import LLM, SamplingParams
    from tokenmill.models.expert_parallel import init_expert_parallel, shutdown_expert_parallel
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        init_expert_parallel()
        llm = LLM(folder, **engine_kwargs)
        experts = llm.llm_engine.runner.moe_layers
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        reqs = [{"prompt_token_ids": p} for p in prompts]
        dist.barrier()
        start = time.perf_counter()
        outs = llm.generate(reqs, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        result = {"rank": rank, "seconds": seconds, "tokens": [o.outputs[0].token_ids for o in outs],
                  "local_experts": [list(m.local) for m in experts[:1]],
                  "expert_load": llm.llm_engine.runner.expert_load.summary()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        shutdown_expert_parallel()
        dist.destroy_process_group()


def generate_expert_parallel(folder: str, prompts: list[list[int]], max_tokens: int, world: int = 2,
                             **engine_kwargs) -> list[dict]:
    """Per process: {"rank", "seconds", "tokens", "local_experts", "expert_load"}."""
    import torch.multiprocessing as mp
    engine_kwargs.setdefault("num_threads", max(1, len(os.sched_getaffinity(0)) // world))
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world, free_port(), str(folder), prompts, max_tokens, engine_kwargs, out_dir),
                 nprocs=world, join=True)
        return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
