"""Cost of first-write faults on a fresh anonymous 4 KiB-page region: touch vs MADV_POPULATE_WRITE."""
import mmap, time, ctypes, sys, resource
import numpy as np
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
n = int(float(sys.argv[1]) * (1 << 30))
for mode in sys.argv[2:]:
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, dtype=np.uint8)
    addr = a.ctypes.data
    r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
    if mode == "touch":
        a[::4096] = 1
    else:
        for off in range(0, n, 32 << 20):
            assert libc.madvise(ctypes.c_void_p(addr + off), min(32 << 20, n - off), 23) == 0
    dt = time.perf_counter() - t; r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{mode}: {n >> 20} MiB in {dt:.2f} s = {dt / (n / 4096) * 1e6:.2f} us/page; stime {r1.ru_stime - r0.ru_stime:.2f} s, minflt {r1.ru_minflt - r0.ru_minflt}", flush=True)
    del a; m.close()
