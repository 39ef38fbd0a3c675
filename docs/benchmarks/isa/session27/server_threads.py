"""Per-thread CPU time (/proc) of a `tokenmill serve` process while it serves 5 chat requests of PROMPT_TOKENS.

    python docs/benchmarks/isa/session27/server_threads.py SERVER_PID PROMPT_TOKENS   (session 27: 1024)
"""
import os, sys, time, threading
from openai import OpenAI
pid = int(sys.argv[1]); n = int(sys.argv[2])
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from tokenmill.bench.workloads import PromptBuilder, load_tokenizer
import numpy as np
M = "/root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-bec1d71155329fe0"
b = PromptBuilder(load_tokenizer(M)); rng = np.random.default_rng(1)
c = OpenAI(base_url="http://127.0.0.1:8011/v1", api_key="x"); model = c.models.list().data[0].id
def snap():
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            s = open(f"/proc/{pid}/task/{t}/stat").read()
            name = s[s.index("(")+1:s.rindex(")")]; f = s[s.rindex(")")+2:].split()
            out[t] = (name, int(f[11]) + int(f[12]))
        except OSError: pass
    return out
def one():
    t0 = time.perf_counter()
    for ch in c.chat.completions.create(model=model, messages=[{"role": "user", "content": b.text(n, rng)}], max_tokens=2, stream=True, extra_body={"ignore_eos": True}):
        pass
    return time.perf_counter() - t0
one()
a = snap(); t0 = time.perf_counter(); ts = [one() for _ in range(5)]; wall = time.perf_counter() - t0; z = snap()
print("req ms", [round(t*1e3) for t in ts], "wall", round(wall, 2))
tot = 0
for t, (name, v) in z.items():
    d = v - a.get(t, (name, 0))[1]
    tot += d
    if d: print(t, name, d, "ticks")
print("total ticks", tot, "= cpu s", tot / os.sysconf("SC_CLK_TCK"))
