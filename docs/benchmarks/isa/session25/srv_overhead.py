import subprocess, sys, time, re, urllib.request, numpy as np
sys.path.insert(0, "/work/main")
from openai import OpenAI
from benchmarks.compare_vllm_serve import stop, wait_ready
from tokenmill.bench.workloads import PromptBuilder, load_tokenizer
MODEL = "/root/.cache/tokenmill/gguf/SmolLM2-135M-Instruct.Q4_1-bec1d71155329fe0"
cmd = [sys.executable, "-m", "tokenmill.cli", "serve", "--model", MODEL, "--port", "8011", "--dtype", "bfloat16",
       "--max-model-len", "8192", "--disable-log-stats", "--quantization", "none"] + sys.argv[1:]
def metric(name):
    txt = urllib.request.urlopen("http://127.0.0.1:8011/metrics").read().decode()
    m = re.search(r"^tokenmill:%s_sum\{[^}]*\} (\S+)" % name, txt, re.M) or re.search(r"^tokenmill:%s_sum (\S+)" % name, txt, re.M)
    return float(m.group(1))
with open("/tmp/s25/srv_overhead.log", "w") as f:
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd="/work/main")
    try:
        wait_ready("http://127.0.0.1:8011", p, 300)
        c = OpenAI(base_url="http://127.0.0.1:8011/v1", api_key="x"); model = c.models.list().data[0].id
        b = PromptBuilder(load_tokenizer(MODEL)); rng = np.random.default_rng(1)
        for n in (8, 512):
            for rep in range(6):
                text = b.text(n, rng)
                t_ttft0, t_q0 = metric("time_to_first_token_seconds"), metric("request_queue_time_seconds")
                t0 = time.perf_counter(); first = None; usage = None
                for ch in c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], max_tokens=2,
                                                    stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
                    if first is None and ch.choices and (ch.choices[0].delta.content or ch.choices[0].finish_reason):
                        first = time.perf_counter() - t0
                    if ch.usage: usage = ch.usage.prompt_tokens
                time.sleep(0.3)
                print(n, usage, f"client {first*1e3:.1f} ms engine ttft {(metric('time_to_first_token_seconds')-t_ttft0)*1e3:.1f} queue {(metric('request_queue_time_seconds')-t_q0)*1e3:.1f}", flush=True)
    finally:
        stop(p)
