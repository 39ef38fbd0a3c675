"""`tokenmill cluster --engines 2` end to end: two real engine processes (the tiny model) on
loopback behind the router, the profile planner forced to move an engine (a role profile whose
prefill is so fast that a dedicated prefill engine would idle, a 0.3 s interval, patience 1), the
official openai client.

Asserts: the first requests are handed over (1P+1D at start); the planner then moves the prefill
engine into the decode pool (colocated), and the move is logged (the cluster's log, /router/planner
with its reason and queues) and exported (/metrics); requests in flight across the move finish,
and every output (before, across and after the move) is token-identical to a colocated engine's
(greedy); afterwards no KV block is held on either engine. Engine steps sleep 50 ms
(TOKENMILL_TEST_STEP_DELAY_S) so that requests outlast a planner interval on any machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from e2e_helpers import REPO, SLOW_STEP_ENV, TINY_ENGINE_ARGS, end_process, free_port, two_free_ports
from test_disagg import metric, wait_no_blocks

from tokenmill.disagg.launchers import wait_healthy

PROMPTS = [[(7 * i + k) % 500 + 3 for i in range(120)] for k in range(4)] + [[11, 12, 13, 14, 15]]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def cluster(tiny_llama, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    profile = {"prefill": {"isl": [1, 100000], "ttft_s": [1e-6, 1e-1]},  # 1M prompt tokens/s: never a pool
               "decode": {"context": [1, 100000], "batch": [1, 1000], "itl_s": [[0.01, 1.0], [0.01, 1.0]],
                          "kv_tokens": 1e6}}
    (tmp / "role.json").write_text(json.dumps(profile))
    port, first = free_port(), two_free_ports()
    engine_args = " ".join([*TINY_ENGINE_ARGS, "--served-model-name", "tiny", "--disable-log-stats"])
    cmd = [sys.executable, "-m", "tokenmill", "cluster", "--engines", "2", "--prefill", "1", "--model", str(tiny_llama),
           "--engine-args", engine_args, "--port", str(port), "--first-engine-port", str(first), "--log-dir",
           str(tmp), "--planner", "profile", "--planner-profile", str(tmp / "role.json"), "--planner-interval",
           "0.3", "--planner-patience", "1", "--planner-cooldown", "0", "--min-remote-prefill-tokens", "32"]
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **SLOW_STEP_ENV)
    log = open(tmp / "cluster.log", "wb")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, lambda: None if proc.poll() is None else (tmp / "cluster.log").read_text()[-3000:], 240)
        yield {"url": url, "engines": [f"http://127.0.0.1:{first}", f"http://127.0.0.1:{first + 1}"],
               "log": tmp / "cluster.log"}
    finally:
        end_process(proc)
        log.close()


def client_for(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=120)


def complete(base: str, prompt: list[int], client: openai.OpenAI | None = None) -> tuple[list[str], float, float]:
    """Streamed greedy completion: (text pieces, start, end)."""
    client = client or client_for(base)
    t0 = time.time()
    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True)
    pieces = [c.choices[0].text for c in stream if c.choices]
    return pieces, t0, time.time()


def test_planner_moves_an_engine_while_serving(cluster, server):
    url, engines = cluster["url"], cluster["engines"]
    reference = {i: "".join(complete(server.url, p)[0]) for i, p in enumerate(PROMPTS)}
    # all at once: routed at 1P+1D, before the planner's next interval (clients built first: building one
    # took long enough on a loaded host for the planner to move the prefill engine before a prompt arrived)
    clients = [client_for(url) for _ in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        first = list(pool.map(lambda pc: complete(url, *pc), zip(PROMPTS, clients)))
    planner = httpx.get(url + "/router/planner").json()
    moves = planner["moves"]
    assert planner["pools"] == {"prefill": [], "decode": [engines[1], engines[0]]} and planner["last"]
    assert moves and moves[0]["to"] == "decode" and moves[0]["instance"] == engines[0], moves
    assert "colocate" in moves[0]["reason"] and set(moves[0]["queues"]) == {"prefill", "decode"}
    t_move = moves[0]["time"]
    assert any(t0 < t_move < t1 for _, t0, t1 in first), "no request was in flight across the move"
    assert metric(url, "tokenmill:router_requests_total", path="disaggregated") >= 1  # the first long prompt, at least
    assert metric(url, "tokenmill:planner_role_changes_total", to="decode") == 1
    assert metric(url, "tokenmill:planner_instances", role="prefill") == 0
    assert [json.loads(httpx.get(url + "/router/state").text)[i]["role"] for i in (0, 1)] == ["decode", "decode"]
    handed_over = metric(engines[1], "tokenmill:kv_transfer_bytes_count")
    assert handed_over >= 1
    second = [complete(url, p) for p in PROMPTS]  # after the move: every engine prefills its own requests
    for i in range(len(PROMPTS)):
        assert "".join(first[i][0]) == reference[i] and "".join(second[i][0]) == reference[i], i
    assert sum(metric(e, "tokenmill:kv_transfer_bytes_count") for e in engines) == handed_over  # no more hand-overs
    wait_no_blocks(*engines)
    log = cluster["log"].read_text()
    assert f"planner: {engines[0]} becomes decode" in log
