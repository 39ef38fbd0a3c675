"""Engine busy time vs client TTFT for chat requests on a running `tokenmill serve` at 127.0.0.1:8011.

    python docs/benchmarks/isa/session27/busy_vs_client.py PROMPT_TOKENS SEED   (session 27: 1024 7)
"""
import sys, time, re, urllib.request
import numpy as np
from openai import OpenAI
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from tokenmill.bench.workloads import PromptBuilder, load_tokenizer
M = "/root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-bec1d71155329fe0"
n, seed = int(sys.argv[1]), int(sys.argv[2])
b = PromptBuilder(load_tokenizer(M)); rng = np.random.default_rng(seed)
c = OpenAI(base_url="http://127.0.0.1:8011/v1", api_key="x"); model = c.models.list().data[0].id
def busy():
    t = urllib.request.urlopen("http://127.0.0.1:8011/metrics").read().decode()
    return float(re.search(r"^tokenmill:engine_busy_seconds_total\{[^}]*\} (\S+)", t, re.M).group(1))
for i in range(6):
    b0 = busy(); t0 = time.perf_counter()
    for ch in c.chat.completions.create(model=model, messages=[{"role": "user", "content": b.text(n, rng)}], max_tokens=1, stream=True, extra_body={"ignore_eos": True}):
        pass
    t = time.perf_counter() - t0; time.sleep(0.05)
    print(f"client {t*1e3:.0f} ms busy {(busy()-b0)*1e3:.0f} ms")
