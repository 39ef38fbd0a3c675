# every second: per-CPU busy split (user+nice, system+irq+softirq, steal) from /proc/stat, and the
# processes that used > 5% CPU in that second (from /proc/PID/stat)
import os, time, json, sys
def cpus():
    out = {}
    for line in open("/proc/stat"):
        if line.startswith("cpu") and not line.startswith("cpu "):
            p = line.split(); v = list(map(int, p[1:9]))
            out[p[0]] = v
    return out
def procs():
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                s = open(f"/proc/{pid}/stat").read()
                name = s[s.index("(") + 1:s.rindex(")")]
                f = s[s.rindex(")") + 2:].split()
                out[pid] = (name, int(f[11]) + int(f[12]))
            except (OSError, ValueError):
                pass
    return out
hz = os.sysconf("SC_CLK_TCK")
c0, p0, t0 = cpus(), procs(), time.time()
with open(sys.argv[1], "w") as out:
    while True:
        time.sleep(1.0)
        c1, p1, t1 = cpus(), procs(), time.time()
        dt = t1 - t0
        row = {"t": round(t1, 1)}
        for k in c1:
            a, b = c0[k], c1[k]
            d = [y - x for x, y in zip(a, b)]
            row[k] = {"user": round((d[0] + d[1]) / hz / dt, 2), "sys": round((d[2] + d[5] + d[6]) / hz / dt, 2), "steal": round(d[7] / hz / dt, 2)}
        row["procs"] = {f"{p1[pid][0]}:{pid}": round((p1[pid][1] - p0[pid][1]) / hz / dt, 2) for pid in p1 if pid in p0 and (p1[pid][1] - p0[pid][1]) / hz / dt > 0.05}
        out.write(json.dumps(row) + "\n"); out.flush()
        c0, p0, t0 = c1, p1, t1
