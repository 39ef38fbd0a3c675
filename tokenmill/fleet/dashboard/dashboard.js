// The fleet dashboard: polls /dashboard/data (the fleet's own JSON; totals read from the same
// counters as /metrics) and redraws every panel. ?refresh=MS sets the period (default 2000).
(() => {
"use strict";

const {barChart, lineChart, table} = window.TokenmillCharts;
const REFRESH_MS = Number(new URLSearchParams(location.search).get("refresh")) || 2000;

function names(rows) { return rows.map(r => r.name); }
function col(rows, key) { return rows.map(r => r[key]); }

function render(d) {
  barChart(document.getElementById("cost-per-pool"), {
    labels: names(d.pools), unit: "USD / 1M tokens", series: [{name: "$/1M tokens", values: col(d.pools, "usd_per_1m_tokens")}]});
  barChart(document.getElementById("cost-per-tenant"), {
    labels: names(d.tenants), unit: "USD / 1M tokens", series: [{name: "$/1M tokens", values: col(d.tenants, "usd_per_1m_tokens")}]});
  for (const [id, metric] of [["ttft", "ttft"], ["tpot", "tpot"]]) {
    barChart(document.getElementById(id), {
      labels: names(d.slo_classes), unit: "seconds",
      series: [{name: "p50", values: col(d.slo_classes, `${metric}_p50_s`)},
               {name: "p99", values: col(d.slo_classes, `${metric}_p99_s`)}],
      targets: col(d.slo_classes, `${metric}_target_s`)});
  }
  barChart(document.getElementById("kv"), {
    labels: names(d.pools), unit: "fraction", max: 1,
    series: [{name: "KV usage", values: col(d.pools, "kv_usage")}, {name: "block fill", values: col(d.pools, "block_fill")}]});
  barChart(document.getElementById("prefix"), {
    labels: names(d.pools), unit: "fraction", max: 1,
    series: [{name: "hit rate", values: col(d.pools, "prefix_hit_rate")}]});
  const qLabels = d.slo_classes.map(c => `fleet:${c.name}`).concat(d.pools.map(p => `engine:${p.name}`));
  barChart(document.getElementById("queues"), {
    labels: qLabels, unit: "requests",
    series: [{name: "waiting", values: col(d.slo_classes, "queue_length").concat(col(d.pools, "engine_waiting"))},
             {name: "in flight", values: d.slo_classes.map(() => null).concat(col(d.pools, "in_flight"))}]});
  renderHistory(d);
  table(document.getElementById("pools-table"), d.pools, [
    {key: "name", title: "pool"}, {key: "model", title: "model"}, {key: "hardware", title: "hardware"},
    {key: "price_per_hour", title: "$/hour"}, {key: "requests", title: "requests"},
    {key: "cost_usd", title: "cost $"}, {key: "utilization", title: "utilization"},
    {key: "idle_cost_usd", title: "idle cost $"}]);
  table(document.getElementById("tenants-table"), d.tenants, [
    {key: "name", title: "tenant"}, {key: "slo_class", title: "SLO class"}, {key: "requests", title: "requests"},
    {key: "prompt_tokens", title: "input tokens"}, {key: "completion_tokens", title: "output tokens"},
    {key: "cost_usd", title: "cost $"}, {key: "usd_per_1m_tokens", title: "$/1M tokens"}, {key: "shed", title: "shed"}]);
  table(document.getElementById("top-costs"), d.top_costs, [
    {key: "model", title: "model"}, {key: "pool", title: "pool"}, {key: "tenant", title: "tenant"},
    {key: "slo_class", title: "SLO class"}, {key: "requests", title: "requests"}, {key: "cost_usd", title: "cost $"},
    {key: "usd_per_request", title: "$/request"}, {key: "usd_per_1m_input_tokens", title: "$/1M input"},
    {key: "usd_per_1m_output_tokens", title: "$/1M output"}]);
  const status = document.getElementById("status");
  status.textContent = `updated ${new Date(d.time * 1000).toLocaleTimeString()}`;
  status.dataset.updated = String(d.time);
}

// the fleet's ring buffer of points (one a second): one line per key of point[field]
function lines(history, field, keys) {
  return keys.map(k => ({name: k, values: history.map(p => (p[field] || {})[k] ?? null)}));
}

function renderHistory(d) {
  const h = d.history || [], times = h.map(p => p.t);
  const last = h.length ? h[h.length - 1] : {};
  const keysOf = field => Object.keys(last[field] || {});
  lineChart(document.getElementById("ts-cost-pool"), {times, unit: "USD / 1M tokens",
    series: lines(h, "pool_usd_per_1m", keysOf("pool_usd_per_1m"))});
  lineChart(document.getElementById("ts-cost-tenant"), {times, unit: "USD / 1M tokens",
    series: lines(h, "tenant_usd_per_1m", keysOf("tenant_usd_per_1m"))});
  for (const metric of ["ttft", "tpot"]) {
    const classes = d.slo_classes.filter(c => c[`${metric}_target_s`] != null).map(c => c.name);
    lineChart(document.getElementById(`ts-${metric}`), {times, unit: "seconds",
      series: lines(h, `${metric}_p99_s`, classes),
      targets: d.slo_classes.map(c => ({name: c.name, value: c[`${metric}_target_s`]}))});
  }
  lineChart(document.getElementById("ts-queues"), {times, unit: "requests", series: lines(h, "queue", keysOf("queue"))});
  lineChart(document.getElementById("ts-kv"), {times, unit: "fraction", max: 1, series: lines(h, "kv_usage", keysOf("kv_usage"))});
}

async function refresh() {
  try {
    const r = await fetch("/dashboard/data", {cache: "no-store"});
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
  } catch (e) {
    document.getElementById("status").textContent = `refresh failed: ${e.message}`;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
})();
