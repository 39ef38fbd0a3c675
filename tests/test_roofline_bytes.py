"""`tokenmill bench roofline` counts the bytes a decode step reads as the weights are stored."""
from tokenmill import LLM
from tokenmill.bench.roofline import weight_bytes
from tokenmill.models.linear import Linear


def test_weight_bytes_counts_block_records_not_placeholders(tiny_llama):
    """With int8 layers the count is the float model's, less each quantized layer's float32 weight, plus
    its records (codes, scales, row sums); the shape-only placeholder the records leave must not count."""
    f32 = weight_bytes(LLM(str(tiny_llama), dtype="float32", quantization="none",
                           kv_cache_memory_gb=0.01).llm_engine.runner.model)
    model = LLM(str(tiny_llama), dtype="float32", quantization="int8", kv_cache_memory_gb=0.01).llm_engine.runner.model
    blocks = [m for m in model.modules() if isinstance(m, Linear) and getattr(m, "records", None) is not None]
    assert len(blocks) >= 8  # every layer's four linears
    expected = f32 - sum(4 * m.in_features * m.out_features - m.records.numel() for m in blocks)
    assert weight_bytes(model) == expected
