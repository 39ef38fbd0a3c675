import sys, json, subprocess, time, os, signal
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import compare_vllm as cv
env = cv.peer_env("/opt/vllm-venv", 4, True)
peer = cv.Peer(cv.peer_python("/opt/vllm-venv"), "/tmp/r1/wl8.json", env, "/tmp/r1/peer_idle2.log", 1800)
print("ready", peer.ready.get("engine_start_s"), flush=True)
peer.command("warmup", "warmup", 600)
def faults(tag, *modes):
    r = subprocess.run([sys.executable, "/tmp/r1/faults.py", "1", *modes], capture_output=True, text=True).stdout
    print(tag, r, flush=True)
faults("peer idle:", "touch", "populate", "touch")
os.killpg(peer.proc.pid, signal.SIGSTOP); time.sleep(2)
faults("peer stopped:", "touch", "populate", "touch")
os.killpg(peer.proc.pid, signal.SIGCONT); time.sleep(2)
faults("peer resumed:", "touch", "touch")
ev = peer.command("run", "result", 600)
print("peer run after stop/cont ok:", ev["seconds"], flush=True)
peer.close()
faults("peer gone:", "touch", "touch")
