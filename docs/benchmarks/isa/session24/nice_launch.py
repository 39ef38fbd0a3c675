"""tokenmill serve with the HTTP loop and the detokenizer threads at nice +10 (the engine thread and its
OpenMP workers stay at 0): does a descheduled OpenMP thread explain the online TPOT gap?"""
import os, sys, threading, time

def renice():
    done = set()
    while True:
        for t in threading.enumerate():
            if (t.name == "MainThread" or t.name.startswith("tokenmill-tokenizer")) and t.native_id not in done:
                os.setpriority(os.PRIO_PROCESS, t.native_id, 10)
                done.add(t.native_id)
        time.sleep(2)

if os.environ.get("RENICE") == "1":
    threading.Thread(target=renice, daemon=True, name="renicer").start()
from tokenmill.cli import main
sys.argv = ["tokenmill"] + sys.argv[1:]
main()
