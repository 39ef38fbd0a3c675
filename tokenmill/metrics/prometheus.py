"""PrometheusStatLogger: the engine's StatLogger, exported in the Prometheus text format.

Registered in `LLMEngine.stat_loggers`; `record` runs on the engine loop thread after every step
(prometheus_client is thread-safe, so /metrics may be scraped from any thread). Each instance owns
its CollectorRegistry, so several engines (or tests) never collide. Latencies and cost come from
`tokenmill.metrics.stats` (the one place they are computed). Every series carries a `model_name`
label.

Series (units in the names; counters end in _total):
  histograms  tokenmill:time_to_first_token_seconds, tokenmill:time_per_output_token_seconds,
              tokenmill:inter_token_latency_seconds, tokenmill:e2e_request_latency_seconds,
              tokenmill:request_queue_time_seconds, tokenmill:request_prompt_tokens,
              tokenmill:request_generation_tokens, tokenmill:iteration_tokens
  gauges      tokenmill:num_requests_running, tokenmill:num_requests_waiting,
              tokenmill:kv_cache_usage_perc (fraction of KV blocks in use, 0..1, as vLLM's),
              tokenmill:kv_block_fill_ratio (tokens stored / slots of used blocks, 0..1),
              tokenmill:price_per_hour_usd, tokenmill:output_tokens_per_second,
              tokenmill:cost_per_million_output_tokens_usd (NaN until tokens are generated)
  counters    tokenmill:prefix_cache_queries_total, tokenmill:prefix_cache_hits_total (tokens),
              tokenmill:kv_cache_evictions_total (blocks), tokenmill:num_preemptions_total,
              tokenmill:prompt_tokens_total (prompt tokens computed, cache hits excluded),
              tokenmill:generation_tokens_total, tokenmill:request_success_total{finished_reason},
              tokenmill:engine_busy_seconds_total, tokenmill:spec_decode_num_drafts_total,
              tokenmill:spec_decode_num_draft_tokens_total, tokenmill:spec_decode_num_accepted_tokens_total,
              tokenmill:spec_decode_num_accepted_tokens_per_pos_total{position},
              tokenmill:moe_expert_tokens_total{layer, expert} (MoE models: tokens routed to each
              expert; each token counts once per chosen expert)
  MoE gauge   tokenmill:moe_expert_load_imbalance{layer}: busiest expert's tokens / mean, since start
  KV transfer (prefill/decode roles): histograms tokenmill:kv_transfer_seconds,
              tokenmill:kv_transfer_bytes (per request loaded from a prefill engine); counters
              tokenmill:kv_transfer_recomputes_total{reason} (a hand-over that could not be used: the
              decode engine computed the prompt itself), tokenmill:kv_transfer_sends_total{outcome}
              (acked, timeout, failed: how a prefill engine's held blocks were released)
The cost gauge is the cost of a token while the engine is busy (what a fully loaded device would
pay). What the device really costs at the current traffic, idle time included, is a PromQL away:
  tokenmill:price_per_hour_usd / 3600 * 1e6 / rate(tokenmill:generation_tokens_total[5m])
and utilization is rate(tokenmill:engine_busy_seconds_total[5m]): low utilization means paying for
idle time (consolidate models or shrink the pool); high utilization with growing queue time
means the SLO is at risk (add capacity).
"""
from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tokenmill.metrics.expert_load import ExpertLoad
from tokenmill.metrics.stats import CostWindow, request_timings

logger = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIX = "tokenmill:"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                         1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
KV_BYTES_BUCKETS = tuple(float(1 << k) for k in range(16, 36, 2))  # 64 KiB .. 16 GiB
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class PrometheusStatLogger:
    def __init__(self, model_name: str, price_per_hour: float = 1.0, cost_window_s: float = 60.0,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        self.cost = CostWindow(price_per_hour, cost_window_s)
        labels = ["model_name"]
        reg = self.registry

        def hist(name, doc, buckets):
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=reg).labels(model_name)

        def gauge(name, doc):
            return Gauge(PREFIX + name, doc, labels, registry=reg).labels(model_name)

        def counter(name, doc):
            return Counter(PREFIX + name, doc, labels, registry=reg).labels(model_name)

        # read at scrape time (observe_tables): what leak checks compare with their idle values
        self.used_blocks = gauge("kv_cache_used_blocks", "KV blocks held by requests (idle: 0).")
        self.engine_requests = gauge("engine_requests", "Requests in the engine's table, unfinished (idle: 0).")
        self.open_streams = gauge("engine_open_streams", "Requests with an open output stream (idle: 0).")
        self.kv_resident = gauge("kv_cache_resident_bytes", "Bytes of the KV cache mapped by the OS: the cache "
                                 "is mapped lazily, so this grows towards the KV budget as blocks are first "
                                 "written, then stays (what process RSS includes of it).")
        self.ttft = hist("time_to_first_token_seconds", "Time from arrival to the first output token.",
                         TTFT_BUCKETS)
        self.tpot = hist("time_per_output_token_seconds",
                         "Per request: (last token - first token) / (output tokens - 1).", TOKEN_LATENCY_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Gap between consecutive output tokens.",
                        TOKEN_LATENCY_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Time from arrival to finish.", REQUEST_LATENCY_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Time from arrival to first scheduled.",
                          REQUEST_LATENCY_BUCKETS)
        self.req_prompt = hist("request_prompt_tokens", "Prompt tokens per finished request.", TOKEN_COUNT_BUCKETS)
        self.req_gen = hist("request_generation_tokens", "Output tokens per finished request.", TOKEN_COUNT_BUCKETS)
        self.iter_tokens = hist("iteration_tokens", "Tokens in one engine step (prefill + decode).",
                                TOKEN_COUNT_BUCKETS)
        self.running = gauge("num_requests_running", "Sequences running in the engine.")
        self.waiting = gauge("num_requests_waiting", "Sequences waiting (incl. preempted).")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).")
        self.block_fill = gauge("kv_block_fill_ratio", "Tokens stored / token slots of the used KV blocks (0..1).")
        self.price = gauge("price_per_hour_usd", "Price of the device in USD per hour (--price-per-hour).")
        self.throughput = gauge("output_tokens_per_second",
                                f"Output tokens per busy second over the last {cost_window_s:g} s of busy time.")
        self.cost_gauge = gauge("cost_per_million_output_tokens_usd",
                                "price_per_hour / 3600 * busy seconds / output tokens * 1e6, over the last "
                                f"{cost_window_s:g} s of busy engine time (NaN before any token).")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.evictions = counter("kv_cache_evictions", "Cached KV blocks evicted for reuse.")
        self.preemptions = counter("num_preemptions", "Sequences preempted (recomputed later).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens computed (prefix-cache hits excluded).")
        self.gen_tokens = counter("generation_tokens", "Output tokens generated.")
        self.busy = counter("engine_busy_seconds", "Seconds the engine spent in steps (utilization = "
                            "rate(tokenmill:engine_busy_seconds_total[5m])).")
        self.spec_drafts = counter("spec_decode_num_drafts", "Verification steps of speculative decoding "
                                   "(one per request per step that checked draft tokens).")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted "
                                     "(acceptance rate = accepted / draft tokens; mean accepted length = "
                                     "1 + accepted / drafts).")
        self._spec_per_pos = Counter(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted at each draft position (0 = the first draft).",
                                     labels + ["position"], registry=reg)
        self._success = Counter(PREFIX + "request_success", "Finished sequences by finish reason.",
                                labels + ["finished_reason"], registry=reg)
        self._expert_tokens = Counter(PREFIX + "moe_expert_tokens", "Tokens routed to each expert of each MoE "
                                      "layer (a token counts once per chosen expert).",
                                      labels + ["layer", "expert"], registry=reg)
        self._expert_imbalance = Gauge(PREFIX + "moe_expert_load_imbalance", "Busiest expert's tokens over the "
                                       "mean tokens per expert of a MoE layer, since start (1 = even).",
                                       labels + ["layer"], registry=reg)
        self.kv_seconds = hist("kv_transfer_seconds", "Time to load one request's KV from a prefill engine "
                               "(copy and checks).", TOKEN_LATENCY_BUCKETS)
        self.kv_bytes = hist("kv_transfer_bytes", "Bytes of KV loaded for one request.", KV_BYTES_BUCKETS)
        self._kv_recomputes = Counter(PREFIX + "kv_transfer_recomputes", "KV hand-overs not used: the prompt was "
                                      "computed locally instead.", labels + ["reason"], registry=reg)
        self._kv_sends = Counter(PREFIX + "kv_transfer_sends", "KV hand-overs whose held blocks were released, "
                                 "by outcome (acked by the receiver, timeout, failed to publish).",
                                 labels + ["outcome"], registry=reg)
        self.expert_load = ExpertLoad()
        for reason in ("stop", "length"):
            self._success.labels(model_name, reason)
        self.price.set(price_per_hour)
        self.cost_gauge.set(float("nan"))
        self.throughput.set(0.0)
        # the engine reports cumulative totals: remember the last ones, export the increments
        self._last = {"queries": 0, "hits": 0, "evictions": 0, "preemptions": 0}

    # -- StatLogger ------------------------------------------------------------------------------
    def record(self, sched, it, finished, prefix, evictions) -> None:
        self.running.set(sched.num_running)
        self.waiting.set(sched.num_waiting)
        self.kv_usage.set(sched.kv_usage)
        self.block_fill.set(sched.block_fill)
        self._inc("queries", prefix.queries, self.prefix_queries)
        self._inc("hits", prefix.hits, self.prefix_hits)
        self._inc("evictions", evictions, self.evictions)
        self._inc("preemptions", sched.num_preemptions_total, self.preemptions)
        if it.num_prompt_tokens:
            self.prompt_tokens.inc(it.num_prompt_tokens)
        if it.num_generation_tokens:
            self.gen_tokens.inc(it.num_generation_tokens)
        if it.num_batched_tokens:
            self.iter_tokens.observe(it.num_batched_tokens)
        if it.step_time > 0:
            self.busy.inc(it.step_time)
        if it.num_drafts:
            self.spec_drafts.inc(it.num_drafts)
            self.spec_draft_tokens.inc(it.num_draft_tokens)
            self.spec_accepted.inc(it.num_accepted_tokens)
            for pos, n in enumerate(it.accepted_per_position):
                if n:
                    self._spec_per_pos.labels(self.model_name, str(pos)).inc(n)
        if it.step_time > 0 or it.num_generation_tokens:
            self.cost.add(it.step_time, it.num_generation_tokens)
            self.cost_gauge.set(self.cost.cost_per_million_output_tokens)
            self.throughput.set(self.cost.tokens_per_second)
        if it.expert_load:
            self._record_expert_load(it.expert_load)
        if it.kv_transfer is not None:
            self._record_kv_transfer(it.kv_transfer)
        for req in finished:
            self._finished(req)

    def _record_kv_transfer(self, st) -> None:
        for rec in st.received:
            self.kv_seconds.observe(rec.seconds)
            self.kv_bytes.observe(rec.num_bytes)
        for reason, n in st.recomputes.items():
            self._kv_recomputes.labels(self.model_name, reason).inc(n)
        for outcome, n in st.sends.items():
            self._kv_sends.labels(self.model_name, outcome).inc(n)

    def _record_expert_load(self, step: dict[int, list[int]]) -> None:
        """{model layer index: tokens per expert} of one step."""
        self.expert_load.add(step)
        for layer, row in step.items():
            for e, n in enumerate(row):
                if n:
                    self._expert_tokens.labels(self.model_name, str(layer), str(e)).inc(n)
            self._expert_imbalance.labels(self.model_name, str(layer)).set(
                ExpertLoad.imbalance_of(self.expert_load.tokens[layer]))

    def _inc(self, key: str, total: int, counter) -> None:
        last = self._last[key]
        delta = total - last if total >= last else total  # a reset (e.g. a new engine) starts over
        if delta > 0:
            counter.inc(delta)
        self._last[key] = total

    def _finished(self, req) -> None:
        t = request_timings(req)
        if t.finish_reason is not None:
            self._success.labels(self.model_name, t.finish_reason).inc()
        for hist, value in ((self.queue, t.queue_time), (self.ttft, t.ttft), (self.e2e, t.e2e),
                            (self.tpot, t.tpot)):
            if value is not None:
                hist.observe(value)
        for gap in t.itl:
            self.itl.observe(gap)
        self.req_prompt.observe(t.num_prompt_tokens)
        self.req_gen.observe(t.num_output_tokens)

    def observe_tables(self, used_blocks: int, engine_requests: int, open_streams: int,
                       kv_resident_bytes: int | None = None) -> None:
        if kv_resident_bytes is not None:
            self.kv_resident.set(kv_resident_bytes)
        self.used_blocks.set(used_blocks)
        self.engine_requests.set(engine_requests)
        self.open_streams.set(open_streams)

    # -- exposition ------------------------------------------------------------------------------
    def exposition(self) -> bytes:
        return generate_latest(self.registry)
