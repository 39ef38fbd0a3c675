"""Expert parallelism: two processes on loopback (torch.distributed, gloo), each holding half of
every MoE layer's experts, all-to-all dispatch and combine; greedy tokens identical to one
process, under chunked prefill and a batch of requests."""
import random

import pytest
from tiny_models import make_tiny_model

from tokenmill import LLM, SamplingParams
from tokenmill.bench.ep_launch import generate_expert_parallel


@pytest.mark.parametrize("arch", ["deepseek_v3"])  # shared experts, grouped routing, MLA
def test_two_processes_give_the_tokens_of_one(tmp_path, arch):
    folder = make_tiny_model(tmp_path, arch, seed=5)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(3, 20))] for _ in range(5)]
    kwargs = dict(dtype="float32", block_size=4, num_kv_blocks=128, max_num_batched_tokens=16, num_threads=1)
    single = LLM(str(folder), **kwargs).generate([{"prompt_token_ids": p} for p in prompts],
                                                 SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
                                                 use_tqdm=False)
    expected = [o.outputs[0].token_ids for o in single]
    ranks = generate_expert_parallel(str(folder), prompts, 16, world=2, **kwargs)
    assert [r["local_experts"] for r in ranks] == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]
    for r in ranks:
        assert r["tokens"] == expected
