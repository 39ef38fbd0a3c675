"""The soak run: a mixed load (streams, plain, chat, disconnects, invalid bodies) for a duration;
RSS, fds, threads and KV usage sampled at an interval; no upward trend allowed."""
from __future__ import annotations

import asyncio
import random
import time

from tokenmill.bench.reliability_common import GREEDY, PROMPTS, Row, client, finish, greedy_text
from tokenmill.bench.reliability_probe import ServerProcess, linear_slope, scrape
from tokenmill.sse_reader import sse_lines


async def soak(srv: ServerProcess, duration: float, sample_interval: float, concurrency: int,
               max_tokens: int, seed: int) -> Row:
    row = Row(f"soak {duration:.0f} s")
    rng = random.Random(seed)
    samples: list[dict] = []
    async with client(srv.url, concurrency) as c:
        await greedy_text(c, PROMPTS[0], max_tokens)  # warm-up
        end = time.monotonic() + duration

        async def one_client() -> None:
            while time.monotonic() < end:
                kind = rng.choice(["plain", "stream", "chat", "drop", "invalid"])
                row.sent += 1
                body = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(1, max_tokens), **GREEDY}
                if kind == "chat":
                    r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                                   "max_tokens": body["max_tokens"]})
                elif kind == "invalid":
                    r = await c.post("/v1/completions", json={**body, "temperature": -1})
                    row.completed += r.status_code == 400
                    row.wrong += r.status_code != 400
                    continue
                elif kind in ("stream", "drop"):
                    async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                        async for line in sse_lines(r):
                            if kind == "drop" and line.startswith("data: {"):
                                row.dropped += 1
                                break
                    if kind == "drop":
                        continue
                else:
                    r = await c.post("/v1/completions", json=body)
                row.completed += r.status_code == 200
                row.server_errors += r.status_code >= 500
                row.wrong += r.status_code not in (200, *range(500, 600))

        async def sampler() -> None:
            t0 = time.monotonic()
            while True:
                m = await scrape(c)
                res = srv.resources()
                kv_mb = m.get("tokenmill:kv_cache_resident_bytes", 0.0) / (1 << 20)
                samples.append({"t_s": round(time.monotonic() - t0, 1), **res, "kv_resident_mb": round(kv_mb, 1),
                                # the lazily mapped KV cache fills towards its fixed budget: not a leak
                                "rss_without_kv_mb": round(res["rss_mb"] - kv_mb, 1),
                                "kv_usage": m.get("tokenmill:kv_cache_usage_perc", 0.0)})
                if time.monotonic() >= end:
                    return
                await asyncio.sleep(min(sample_interval, max(0.0, end - time.monotonic())))

        await asyncio.gather(sampler(), *(one_client() for _ in range(concurrency)))
        await finish(row, srv, c)
    row.rss_start_mb = round(samples[0]["rss_mb"], 1)
    steady = samples[1:] if len(samples) > 2 else samples  # the first minute warms caches up
    ts = [s["t_s"] for s in steady]
    keys = ("rss_mb", "rss_without_kv_mb", "kv_resident_mb", "fds", "threads")
    slopes = {k: linear_slope(ts, [s[k] for s in steady]) * 60 for k in keys}
    growth_mb = slopes["rss_without_kv_mb"] / 60 * duration
    row.notes = {"samples": samples, "per_minute": {k: round(v, 3) for k, v in slopes.items()},
                 "concurrency": concurrency}
    row.check(growth_mb <= max(0.05 * row.rss_start_mb, 32),
              f"RSS (without the KV cache's mapped pages) trend +{growth_mb:.1f} MiB over the run")
    row.check(samples[-1]["fds"] <= samples[0]["fds"] + 8, "open file descriptors grew")
    row.check(samples[-1]["threads"] <= samples[0]["threads"] + 4, "threads grew")
    row.check(row.server_errors == 0 and row.wrong == 0, f"{row.server_errors} 5xx, {row.wrong} wrong")
    row.check(row.leaked_blocks == 0, f"{row.leaked_blocks} KV blocks leaked")
    return row
