"""What refused requests cost the engine: one long greedy stream decodes on a server that runs one
request at a time and queues one (`--max-num-seqs 1 --max-waiting-requests 1`); in alternating
windows, clients send a fixed rate of short requests, which (one queued request aside) all get 429.
Prints decode tok/s hammered / alone, averaged over window pairs (the stream's context grows slowly,
so each hammered window is compared with the mean of its neighbours).

    python -m tokenmill.bench.refusal_cost [--rate 400] [--window 2] [--pairs 6] [-- server flags]

A/B against another tree: `PYTHONPATH=OTHER_TREE python -m tokenmill.bench.refusal_cost` (the server
runs from the tree this module is imported from). The load generator shares the machine, so the
ratio includes its CPU too: compare runs of one machine, alternated.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from tokenmill.bench.reliability_common import GREEDY, PROMPTS, client, split_server_flags
from tokenmill.bench.reliability_probe import ServerProcess
from tokenmill.sse_reader import sse_lines


async def measure(url: str, rate: float, window: float, pairs: int) -> dict:
    body = {"prompt": PROMPTS[0], "max_tokens": 16, **GREEDY}
    codes: dict[int, int] = {}
    async with client(url, 64) as c:
        on, done = asyncio.Event(), asyncio.Event()

        async def one() -> None:
            r = await c.post("/v1/completions", json=body)
            codes[r.status_code] = codes.get(r.status_code, 0) + 1

        async def sender() -> None:
            tasks: set[asyncio.Task] = set()
            while not done.is_set():
                await on.wait()
                t = asyncio.create_task(one())
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                await asyncio.sleep(1 / rate)
            await asyncio.gather(*tasks)

        send = asyncio.create_task(sender())
        counts, t0 = [0] * (2 * pairs), None
        stream = {"prompt": PROMPTS[1], "max_tokens": 8000, "stream": True, **GREEDY}
        async with c.stream("POST", "/v1/completions", json=stream) as r:
            async for line in sse_lines(r):
                if not line.startswith("data: {"):
                    continue
                now = time.monotonic()
                t0 = t0 or now
                w = int((now - t0) // window)
                if w >= len(counts):
                    break
                counts[w] += 1
                (on.set if w % 2 else on.clear)()  # odd windows are hammered
        done.set()
        on.set()
        await send
    ratios = [counts[2 * i + 1] / ((counts[2 * i] + counts[2 * i + 2]) / 2) for i in range(pairs - 1)]
    return {"tokens_per_window": counts, "status_codes": codes, "hammered_over_alone": round(sum(ratios) / len(ratios), 3)}


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_server_flags(list(sys.argv[1:] if argv is None else argv))
    p = argparse.ArgumentParser(prog="python -m tokenmill.bench.refusal_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--rate", type=float, default=400.0, help="refused requests offered per second")
    p.add_argument("--window", type=float, default=2.0, help="seconds per window")
    p.add_argument("--pairs", type=int, default=6, help="alone + hammered window pairs")
    a = p.parse_args(argv)
    flags = ["--max-num-seqs", "1", "--max-waiting-requests", "1", "--dtype", "float32", "--num-threads", "1",
             "--max-model-len", "8192", *extra]
    with tempfile.TemporaryDirectory(prefix="tokenmill-refusal-") as tmp:
        srv = ServerProcess([*([a.model] if a.model else []), *flags], Path(tmp) / "server.log").start()
        try:
            result = asyncio.run(measure(srv.url, a.rate, a.window, a.pairs))
        finally:
            srv.stop()
    print(json.dumps({**result, "rate": a.rate, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
