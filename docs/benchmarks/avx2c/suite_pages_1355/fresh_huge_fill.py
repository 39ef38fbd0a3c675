# A fresh 650 MiB buffer filled once with huge pages and once with 4 KiB pages, three times in one process
# (lazy_zeros, then copy_ twice: the first copy maps, the second does not). Run: PYTHONPATH=. python THIS
import time, torch
from tokenmill.host_memory import lazy_zeros
n = 650 << 20
src = torch.ones(n, dtype=torch.uint8)
for r in range(3):
    for huge in (True, False):
        a = lazy_zeros(n, huge=huge)
        t = time.perf_counter(); a.copy_(src); dt = time.perf_counter() - t
        t = time.perf_counter(); a.copy_(src); dt2 = time.perf_counter() - t
        print(f"huge={huge}: first copy {dt:.2f} s ({dt/(n>>12)*1e6:.1f} us/4K page), second {dt2:.3f} s")
        del a
