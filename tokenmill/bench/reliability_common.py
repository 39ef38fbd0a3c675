"""What every reliability run shares: its result row, a loopback client without keep-alive, the
greedy text of a prompt, and the end-of-run check that the server went idle with nothing leaked."""
from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from tokenmill.bench.reliability_probe import ServerProcess, wait_idle

PROMPTS = [f"Story {k}: once upon a time, in a small village by the sea," for k in range(8)]
GREEDY = {"temperature": 0, "ignore_eos": True}


@dataclass
class Row:
    test: str
    sent: int = 0
    completed: int = 0
    shed: int = 0  # 429
    server_errors: int = 0  # 5xx
    dropped: int = 0  # clients that left on purpose
    wrong: int = 0  # completed with the wrong text or an unexpected status
    leaked_blocks: float = 0.0
    rss_start_mb: float = 0.0
    rss_end_mb: float = 0.0
    recovery_s: float | None = None
    notes: dict = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)


def split_server_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """`ARGS -- SERVER FLAGS` -> (ARGS, SERVER FLAGS): what follows `--` goes to the server."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def client(url: str, n: int) -> httpx.AsyncClient:
    # no keep-alive: a pooled connection the server closes as idle while the client reuses it is a
    # client-side race (httpx ReadError), not what these runs measure
    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=0)
    return httpx.AsyncClient(base_url=url, timeout=600, limits=limits)


async def greedy_text(c: httpx.AsyncClient, prompt: str, max_tokens: int) -> str:
    r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, **GREEDY})
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


async def finish(row: Row, srv: ServerProcess, c: httpx.AsyncClient, timeout: float = 120) -> None:
    recovery, m = await wait_idle(c, timeout)
    row.recovery_s = None if recovery is None else round(recovery, 3)
    row.leaked_blocks = m.get("tokenmill:kv_cache_used_blocks", 0.0)
    row.check(recovery is not None, f"not idle {timeout} s after the load: {m}")
    row.rss_end_mb = round(srv.resources()["rss_mb"], 1)
