"""What a decode step costs outside the kernels' work: a random 30-layer Llama with SmolLM2-135M's heads
(9/3, head dim 16 at hidden 144) whose kernels have almost nothing to do, B sequences of 256-token
prompts; prints the engine step and model.forward times (best of 3 x 50 steps).
    [TOKENMILL_NATIVE_DECODE=0] python docs/benchmarks/isa/session33/tiny_stack_probe.py B"""
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parents[4] / "tests"))
from tiny_models import make_tiny_model  # noqa: E402
from tokenmill import LLM, SamplingParams  # noqa: E402

B, CTX = int(sys.argv[1]), 256
folder = make_tiny_model(pathlib.Path(tempfile.mkdtemp()) / "tiny30", num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, hidden_size=144, max_position_embeddings=2048)
eng = LLM(str(folder), dtype="auto", quantization="none", max_model_len=2048).llm_engine
model = eng.runner.model
forward_s = [0.0]
forward = model.forward


def timed(*args, **kwargs):
    t = time.perf_counter()
    out = forward(*args, **kwargs)
    forward_s[0] += time.perf_counter() - t
    return out


model.forward = timed


def steps(n: int) -> tuple[float, float]:
    for _ in range(B):
        eng.add_request(None, {"prompt_token_ids": list(range(10, 10 + CTX))},
                        SamplingParams(max_tokens=n + 40, temperature=0, ignore_eos=True))
    for _ in range(B * CTX // 1024 + 2):
        eng.step()
    forward_s[0] = 0.0
    t = time.perf_counter()
    for _ in range(n):
        eng.step()
    step = (time.perf_counter() - t) / n
    fwd = forward_s[0] / n
    while eng.has_unfinished_requests():
        eng.step()
    return step, fwd


steps(10)
step, fwd = min(steps(50) for _ in range(3))
print(f"B={B}: step {step * 1e3:.2f} ms, model.forward {fwd * 1e3:.2f} ms")
