// tokenmill's chart library for the fleet dashboard: grouped bar charts, time series and tables drawn as plain
// SVG / DOM, no dependencies (the page ships in the Python package; no CDN, no build step).
// Every bar carries data-series, data-label and data-value, so tests can read what is drawn.
(() => {
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#3b6fd8", "#e07b39", "#3aa57a", "#b04fc7", "#c9a227", "#d64550"];

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function formatNumber(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (Number.isInteger(v) && digits === undefined) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
  return v.toFixed(digits === undefined ? (a >= 100 ? 1 : a >= 1 ? 2 : 4) : digits);
}

// opts: {labels: [..], series: [{name, values: [..]}], unit, targets: [..] (one per label, or null),
//        max (fixed top of the axis, e.g. 1 for ratios)}
function barChart(container, opts) {
  const width = 440, height = 220, left = 58, right = 10, top = 22, bottom = 40;
  const svg = svgEl("svg", {viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img"});
  const labels = opts.labels, series = opts.series;
  const values = series.flatMap(s => s.values).concat(opts.targets || []).filter(v => v !== null && v !== undefined && !Number.isNaN(v));
  const vmax = Math.max(0, ...values);
  const top_value = opts.max !== undefined ? opts.max : (vmax > 0 ? vmax * 1.15 : 1);
  const plotW = width - left - right, plotH = height - top - bottom;
  const y = v => top + plotH - (Math.max(0, v) / top_value) * plotH;
  for (let i = 0; i <= 4; i++) {  // axis grid and ticks
    const v = top_value * i / 4, yy = y(v);
    svg.appendChild(svgEl("line", {x1: left, x2: width - right, y1: yy, y2: yy, class: "grid"}));
    svg.appendChild(svgEl("text", {x: left - 4, y: yy + 4, "text-anchor": "end", class: "tick"}, formatNumber(v, 2)));
  }
  if (opts.unit) svg.appendChild(svgEl("text", {x: 4, y: 12, class: "unit"}, opts.unit));
  const groupW = labels.length ? plotW / labels.length : plotW;
  const barW = Math.max(2, (groupW * 0.8) / Math.max(1, series.length));
  labels.forEach((label, i) => {
    const gx = left + i * groupW + groupW * 0.1;
    series.forEach((s, j) => {
      const v = s.values[i];
      const has = v !== null && v !== undefined && !Number.isNaN(v);
      const rect = svgEl("rect", {x: gx + j * barW, y: has ? y(v) : y(0), width: barW - 1,
                                  height: has ? y(0) - y(v) : 0, fill: PALETTE[j % PALETTE.length],
                                  "data-series": s.name, "data-label": label, "data-value": has ? v : ""});
      rect.appendChild(svgEl("title", {}, `${s.name} ${label}: ${formatNumber(v)}`));
      svg.appendChild(rect);
    });
    const t = opts.targets && opts.targets[i];
    if (t !== null && t !== undefined) {
      svg.appendChild(svgEl("line", {x1: gx - 2, x2: gx + groupW * 0.8 + 2, y1: y(t), y2: y(t), class: "target",
                                     "data-label": label, "data-target": t}));
    }
    svg.appendChild(svgEl("text", {x: gx + groupW * 0.4, y: height - bottom + 14, "text-anchor": "middle",
                                   class: "label"}, label));
  });
  series.forEach((s, j) => {  // legend
    const lx = left + j * 110;
    svg.appendChild(svgEl("rect", {x: lx, y: height - 14, width: 10, height: 10, fill: PALETTE[j % PALETTE.length]}));
    svg.appendChild(svgEl("text", {x: lx + 14, y: height - 5, class: "legend"}, s.name));
  });
  if (opts.targets && opts.targets.some(t => t !== null && t !== undefined)) {
    const lx = left + series.length * 110;
    svg.appendChild(svgEl("line", {x1: lx, x2: lx + 12, y1: height - 9, y2: height - 9, class: "target"}));
    svg.appendChild(svgEl("text", {x: lx + 16, y: height - 5, class: "legend"}, "target"));
  }
  container.replaceChildren(svg);
}

// A time series chart: opts = {times: [unix seconds], series: [{name, values: [.. or null]}], unit,
// targets: [{name, value}] (dashed horizontal lines), max}. Each series is one polyline over its
// non-null points (data-series, data-points = how many, data-last = the latest value); the svg's
// data-last-t is the latest time drawn. The x axis is seconds before the latest point.
function lineChart(container, opts) {
  const perRow = 4, rows = Math.max(1, Math.ceil(opts.series.length / perRow));
  const width = 440, left = 58, right = 10, top = 22, bottom = 28 + 12 * rows, height = 180 + bottom;
  const svg = svgEl("svg", {viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img"});
  const times = opts.times, series = opts.series, targets = (opts.targets || []).filter(t => t.value != null);
  const ok = v => v !== null && v !== undefined && !Number.isNaN(v);
  const values = series.flatMap(s => s.values.filter(ok)).concat(targets.map(t => t.value));
  const vmax = Math.max(0, ...values);
  const topValue = opts.max !== undefined ? opts.max : (vmax > 0 ? vmax * 1.15 : 1);
  const t1 = times.length ? times[times.length - 1] : 0, t0 = times.length ? times[0] : 0;
  const span = Math.max(1, t1 - t0);
  const plotW = width - left - right, plotH = height - top - bottom;
  const x = t => left + ((t - t0) / span) * plotW;
  const y = v => top + plotH - (Math.max(0, v) / topValue) * plotH;
  for (let i = 0; i <= 4; i++) {
    const v = topValue * i / 4, yy = y(v);
    svg.appendChild(svgEl("line", {x1: left, x2: width - right, y1: yy, y2: yy, class: "grid"}));
    svg.appendChild(svgEl("text", {x: left - 4, y: yy + 4, "text-anchor": "end", class: "tick"}, formatNumber(v, 2)));
  }
  for (let i = 0; i <= 2; i++) {
    const t = t0 + span * i / 2;
    svg.appendChild(svgEl("text", {x: x(t), y: height - bottom + 14, "text-anchor": "middle", class: "label"},
                          `-${Math.round(t1 - t)} s`));
  }
  if (opts.unit) svg.appendChild(svgEl("text", {x: 4, y: 12, class: "unit"}, opts.unit));
  series.forEach((s, j) => {
    const pts = [];
    s.values.forEach((v, i) => { if (ok(v)) pts.push([times[i], v]); });
    const line = svgEl("polyline", {points: pts.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "),
                                    fill: "none", stroke: PALETTE[j % PALETTE.length], "stroke-width": 1.5,
                                    "data-series": s.name, "data-points": pts.length,
                                    "data-last": pts.length ? pts[pts.length - 1][1] : ""});
    line.appendChild(svgEl("title", {}, `${s.name}: ${formatNumber(pts.length ? pts[pts.length - 1][1] : null)}`));
    svg.appendChild(line);
  });
  targets.forEach(t => {
    svg.appendChild(svgEl("line", {x1: left, x2: width - right, y1: y(t.value), y2: y(t.value), class: "target",
                                   "data-label": t.name, "data-target": t.value}));
  });
  series.forEach((s, j) => {  // legend, perRow a row
    const lx = left + (j % perRow) * 95, ly = height - 12 * (rows - Math.floor(j / perRow)) - 2;
    svg.appendChild(svgEl("rect", {x: lx, y: ly, width: 10, height: 10, fill: PALETTE[j % PALETTE.length]}));
    svg.appendChild(svgEl("text", {x: lx + 14, y: ly + 9, class: "legend"}, s.name));
  });
  svg.dataset.lastT = String(t1);
  container.replaceChildren(svg);
}

// rows: list of objects; columns: [{key, title, format}]
function table(container, rows, columns) {
  const t = document.createElement("table");
  const head = t.createTHead().insertRow();
  for (const c of columns) {
    const th = document.createElement("th");
    th.textContent = c.title;
    head.appendChild(th);
  }
  const body = t.createTBody();
  for (const r of rows) {
    const tr = body.insertRow();
    for (const c of columns) {
      const td = tr.insertCell();
      const v = r[c.key];
      td.textContent = c.format ? c.format(v) : (typeof v === "number" ? formatNumber(v) : String(v ?? "–"));
      td.dataset.key = c.key;
      if (typeof v === "number") td.dataset.value = v;
    }
  }
  container.replaceChildren(t);
}

window.TokenmillCharts = {barChart, lineChart, table, formatNumber};
})();
