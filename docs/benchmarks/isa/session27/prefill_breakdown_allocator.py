"""Runs docs/benchmarks/isa/session25/prefill_breakdown.py; NO_MALLOPT=1 turned off the trial malloc.keep_freed_blocks()
(session 27, not kept: with today's code the switch has nothing to turn off)."""
import os, runpy, sys
from pathlib import Path
import tokenmill.malloc as m
if os.environ.get("NO_MALLOPT"):
    m.keep_freed_blocks = lambda: False
sys.argv = ["pb"] + sys.argv[1:]
runpy.run_path(str(Path(__file__).resolve().parents[1] / "session25" / "prefill_breakdown.py"), run_name="__main__")
