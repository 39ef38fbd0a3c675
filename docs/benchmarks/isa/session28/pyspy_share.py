"""Share of py-spy samples inside a frame (default ModelRunner._execute) that are not inside a custom operator
call (OpOverloadPacket.__call__): Python, and the aten ops that Python lines call directly; then the frames
those samples were in, by inclusive share.
    py-spy record -r 50 -f raw -o w1.txt -- python docs/benchmarks/isa/session28/step_split.py 100
    python docs/benchmarks/isa/session28/pyspy_share.py w1.txt [FRAME]"""
import collections
import re
import sys

path = sys.argv[1]
within = sys.argv[2] if len(sys.argv) > 2 else "ModelRunner._execute"
total = outside = 0
frames_outside: collections.Counter = collections.Counter()
for line in open(path):
    stack, _, count = line.rstrip().rpartition(" ")
    frames = stack.split(";")
    if not any(within in f for f in frames):
        continue
    total += int(count)
    if "OpOverloadPacket.__call__" in frames[-1]:
        continue
    outside += int(count)
    for name in {re.sub(r" \((.*?):\d+\)", r" (\1)", f) for f in frames}:
        frames_outside[name] += int(count)
print(f"{total} samples in {within}; {outside} ({outside / max(total, 1) * 100:.1f}%) outside custom operators")
for name, n in frames_outside.most_common(25):
    print(f"{n / total * 100:5.1f}% {name}")
