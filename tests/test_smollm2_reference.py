"""The embedded default model (SmolLM2-135M-Instruct from the GGUF) against transformers, float32:
greedy outputs must be token-for-token identical (min_tokens, like
HF min_new_tokens, masks EOS so both run the full length)."""
import pytest
import torch
import transformers

from tokenmill import LLM, SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "Water boils at a temperature of",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def llm_f32(smollm2_folder):
    return LLM(str(smollm2_folder), dtype="float32", kv_cache_memory_gb=0.25)


def test_greedy_identical_to_transformers(llm_f32, smollm2_folder):
    outs = llm_f32.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0),
                            use_tqdm=False)
    ref = transformers.AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32).eval()
    for prompt, out in zip(PROMPTS, outs):
        ids = torch.tensor([out.prompt_token_ids])
        with torch.inference_mode():
            expect = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                  min_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=2)
        assert out.outputs[0].token_ids == expect[0, ids.shape[1]:].tolist(), prompt


def test_chat_uses_the_gguf_chat_template(llm_f32):
    out = llm_f32.chat([{"role": "user", "content": "What is the capital of France?"}],
                       SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)[0]
    tok = llm_f32.get_tokenizer()
    assert tok.decode(out.prompt_token_ids).startswith("<|im_start|>system")
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason in ("stop", "length")


def test_stop_string_before_min_tokens_is_not_cut(llm_f32, smollm2_folder):
    """A stop string that appears before min_tokens is reached is ignored, as in vLLM: the text
    stays equal to the decoded token ids (it used to be cut out of the middle while generation went
    on). Default model, float32, greedy."""
    ids = [1, 504, 2365, 282, 4649, 314]
    params = SamplingParams(max_tokens=40, min_tokens=30, stop=["French-American"], temperature=0)
    out = llm_f32.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0]
    decoded = llm_f32.get_tokenizer().decode(out.token_ids, skip_special_tokens=True)
    assert "French-American" in decoded[:40]  # the stop string does occur, early
    assert out.text == decoded[:len(out.text)] and len(out.token_ids) >= 30
    if out.finish_reason == "stop":  # a later occurrence (past min_tokens) may legitimately stop it
        assert out.stop_reason == "French-American" and decoded.startswith(out.text + "French-American")
    else:
        assert out.text == decoded
