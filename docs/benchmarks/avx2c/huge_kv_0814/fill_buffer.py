import time, torch, sys
from tokenmill.host_memory import lazy_zeros
huge = sys.argv[1] == "1"; n = int(sys.argv[2]) << 20
t0 = time.perf_counter(); a = lazy_zeros(n, huge=huge); a.fill_(1); print("huge", huge, n >> 20, "MiB %.3f s" % (time.perf_counter() - t0))
