"""MoE routing against transformers' own router modules (many tokens, every routing rule), and
the expert-load metrics the runner counts (Prometheus series, benchmark summary)."""
import pytest
import torch
import transformers
from tiny_models import make_tiny_model

from tokenmill import LLM, SamplingParams
from tokenmill.metrics.expert_load import ExpertLoad
from tokenmill.metrics.prometheus import PrometheusStatLogger
from tokenmill.models.registry import get_model_class
from tokenmill.models.routing import route

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=512, intermediate_size=128)


def _hf_router(kind: str, **cfg):
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
    classes = {"mixtral": (transformers.MixtralConfig, MixtralTopKRouter, "MixtralForCausalLM"),
               "qwen2_moe": (transformers.Qwen2MoeConfig, Qwen2MoeTopKRouter, "Qwen2MoeForCausalLM"),
               "deepseek_v2": (transformers.DeepseekV2Config, DeepseekV2TopkRouter, "DeepseekV2ForCausalLM"),
               "deepseek_v3": (transformers.DeepseekV3Config, DeepseekV3TopkRouter, "DeepseekV3ForCausalLM")}
    config_cls, router_cls, arch = classes[kind]
    config = config_cls(**BASE, **cfg)
    hf = config.to_dict()
    hf["architectures"] = [arch]
    return router_cls(config), get_model_class(arch).config_from_hf(hf).moe


@pytest.mark.parametrize("kind,cfg", [
    ("mixtral", dict(num_local_experts=8, num_experts_per_tok=2)),
    ("qwen2_moe", dict(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=False)),
    ("qwen2_moe", dict(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=True)),
    ("deepseek_v2", dict(n_routed_experts=16, num_experts_per_tok=3, moe_intermediate_size=32, topk_method="greedy",
                         routed_scaling_factor=2.0)),
    ("deepseek_v2", dict(n_routed_experts=16, num_experts_per_tok=3, moe_intermediate_size=32,
                         topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=1.5)),
    ("deepseek_v3", dict(n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, n_group=4,
                         topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)),
    ("deepseek_v3", dict(n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, n_group=4,
                         topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False)),
])
def test_routing_matches_transformers(kind, cfg):
    torch.manual_seed(0)
    router, spec = _hf_router(kind, **cfg)
    with torch.no_grad():
        router.weight.normal_(std=0.5)
        bias = None
        if hasattr(router, "e_score_correction_bias"):
            router.e_score_correction_bias.normal_(std=0.1)
            bias = router.e_score_correction_bias
        x = torch.randn(500, 64)
        _, ref_w, ref_ids = router(x)
        weights, ids = route(torch.nn.functional.linear(x, router.weight.float()), spec, bias)
    # same experts per token (order within the top-k is not part of the contract) and weights
    ref_sorted, ref_order = ref_ids.sort(dim=-1)
    ours_sorted, our_order = ids.sort(dim=-1)
    assert torch.equal(ours_sorted, ref_sorted)
    torch.testing.assert_close(weights.gather(1, our_order), ref_w.float().gather(1, ref_order), atol=1e-6, rtol=1e-5)


def test_expert_load_is_counted_and_exported(tmp_path):
    folder = make_tiny_model(tmp_path, "mixtral", seed=3)
    llm = LLM(str(folder), dtype="float32", block_size=4, num_kv_blocks=128, enable_prefix_caching=False)
    engine = llm.llm_engine
    prom = PrometheusStatLogger("tiny-mixtral")
    engine.stat_loggers.append(prom)
    prompts = [[5 + i, 17, 300 - i, 42, 9, 250 + i] for i in range(4)]
    llm.generate([{"prompt_token_ids": p} for p in prompts],
                 SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
    tokens_computed = sum(len(p) + 8 - 1 for p in prompts)  # every prompt token and every output but the last
    load = engine.runner.expert_load
    assert sorted(load.tokens) == [0, 1]
    for layer, row in load.tokens.items():
        assert len(row) == 8 and sum(row) == 2 * tokens_computed  # top-2
        assert prom.expert_load.tokens[layer] == row
    text = prom.exposition().decode()
    assert 'tokenmill:moe_expert_tokens_total{expert="0",layer="0",model_name="tiny-mixtral"}' in text
    assert "tokenmill:moe_expert_load_imbalance{" in text
    summary = load.summary()
    assert summary["imbalance_max_over_mean_worst_layer"] >= 1.0
    assert [entry["layer"] for entry in summary["layers"]] == [0, 1]


def test_imbalance_is_max_over_mean():
    load = ExpertLoad()
    load.add({3: [4, 0, 0, 0]})
    load.add({3: [0, 2, 1, 1]})
    assert load.tokens == {3: [4, 2, 1, 1]}
    assert load.imbalance() == {3: 2.0}
