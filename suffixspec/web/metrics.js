// Metrics view: poll GET /metrics (Prometheus text format), keep a short history in the page, and
// chart acceptance by source and tokens/requests per second over time.

import { ApiError, getJSON, request } from "./api.js";
import { fmtNum, lines } from "./charts.js";
import { addStat } from "./dom.js";
import { normSource, renderLegend, sourceColor, sourceLabel } from "./sources.js";

const $ = (id) => document.getElementById(id);
const KEEP = 180; // polls kept (15 minutes at 5 s)

/**
 * Parse Prometheus text exposition into [{name, labels, value}]. Comments and malformed lines are
 * skipped. Example: `suffixspec_accepted_tokens_total{source="prompt"} 42` ->
 * {name: "suffixspec_accepted_tokens_total", labels: {source: "prompt"}, value: 42}.
 */
export function parsePrometheus(text) {
  const out = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      const re = /([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"/g;
      let lm;
      while ((lm = re.exec(m[3]))) labels[lm[1]] = lm[2].replace(/\\n/g, "\n").replace(/\\(["\\])/g, "$1");
    }
    const v = m[4] === "+Inf" ? Infinity : m[4] === "-Inf" ? -Infinity : Number(m[4]);
    if (!Number.isNaN(v)) out.push({ name: m[1], labels, value: v });
  }
  return out;
}

/** Sum of samples whose name matches `re` (histogram/summary parts excluded), optionally per label. */
function sum(samples, re, byLabel = null) {
  const acc = byLabel ? {} : { all: 0 };
  let found = false;
  for (const s of samples) {
    if (!re.test(s.name) || /_(bucket|created)$/.test(s.name)) continue;
    found = true;
    const key = byLabel ? s.labels[byLabel] ?? "all" : "all";
    acc[key] = (acc[key] || 0) + s.value;
  }
  if (!found) return null;
  return byLabel ? acc : acc.all;
}

/** The few figures the page shows, from one scrape. Names are matched loosely on purpose. */
export function summarize(samples) {
  return {
    // Finished generations; plain HTTP request counters would also count these polls.
    requests: sum(samples, /generations_total$/) ?? sum(samples, /(completion|generation)_requests_total$/),
    promptTokens: sum(samples, /prompt_tokens_total$/),
    completionTokens: sum(samples, /(completion|generated|output)_tokens_total$/),
    drafted: sum(samples, /draft(ed)?_tokens_total$/, "source"),
    accepted: sum(samples, /accepted_tokens_total$/, "source"),
    steps: sum(samples, /steps_total$/),
  };
}

const history = []; // [{t, ...summarize()}]
let timer = null;
let visible = false;
let drawn = { acceptance: [], tokens: [], requests: [] }; // the charts' series as last drawn

/**
 * The series the charts show, as last drawn: `tokens` and `requests` are [[t ms, per second], ...];
 * `acceptance` is [{id, points: [[t ms, rate or null], ...]}] (null: nothing drafted in that interval).
 * Read by the browser tests; handy in the console too.
 */
export function chartData() {
  return drawn;
}

const dd = addStat;

const cssVar = (name) => `var(${name}, #888)`; // resolved by the browser, so colours follow light/dark

function ratio(a, b) {
  return b ? a / b : NaN;
}

function render() {
  const last = history[history.length - 1];
  const dl = $("metric-totals");
  dl.replaceChildren();
  if (!last) return;
  const accAll = last.accepted ? Object.values(last.accepted).reduce((a, b) => a + b, 0) : null;
  const draftAll = last.drafted ? Object.values(last.drafted).reduce((a, b) => a + b, 0) : null;
  dd(dl, "Requests", last.requests === null ? "–" : fmtNum(last.requests));
  dd(dl, "Completion tokens", last.completionTokens === null ? "–" : fmtNum(last.completionTokens));
  dd(dl, "Prompt tokens", last.promptTokens === null ? "–" : fmtNum(last.promptTokens));
  dd(dl, "Drafted / accepted", `${draftAll === null ? "–" : fmtNum(draftAll)} / ${accAll === null ? "–" : fmtNum(accAll)}`);
  const rate = ratio(accAll, draftAll);
  dd(dl, "Acceptance rate (all time)", pct(rate));
  if (last.steps !== null && last.completionTokens !== null) {
    dd(dl, "Mean tokens per step", fmtNum(ratio(last.completionTokens, last.steps)));
  }

  // Acceptance rate per source over each polling interval. An interval in which nothing was drafted
  // (idle, or a long request still running: drafts are counted when a request ends) has no rate: a gap,
  // not the all-time rate (that is in the table below).
  const sources = new Set();
  for (const h of history) for (const k of Object.keys(h.drafted || {})) sources.add(k);
  // The first poll's point is the figure since the server started (its uptime from /health), so the
  // charts show something from the first view on rather than waiting for a second poll.
  const first = history[0];
  const acc = [...sources].map((src) => {
    const points = [];
    const d0 = (first.drafted || {})[src] || 0;
    if (first.uptime) points.push([first.t, d0 > 0 ? ((first.accepted || {})[src] || 0) / d0 : null]);
    for (let i = 1; i < history.length; i++) {
      const h = history[i];
      const prev = history[i - 1];
      const drafted = ((h.drafted || {})[src] || 0) - ((prev.drafted || {})[src] || 0);
      const accepted = ((h.accepted || {})[src] || 0) - ((prev.accepted || {})[src] || 0);
      points.push([h.t, drafted > 0 ? accepted / drafted : null]);
    }
    const id = normSource(src);
    return { name: sourceLabel(id), color: sourceColor(id), points, id };
  });
  // Lines at the same rate lie on top of each other (two sources at 0%): dashes let the lower one show
  // through, and the table below gives every source's figures.
  acc.forEach((s, i) => {
    s.dash = DASHES[i % DASHES.length];
  });
  lines($("acc-chart"), acc, {
    label: "Acceptance rate by source over time", yMax: 1, yFormat: (v) => `${Math.round(v * 100)}%`,
    empty: history.length < 2 && !first.uptime ? "waiting for a second poll…" : "nothing drafted yet",
  });
  renderLegend($("acc-legend"), null, acc.map((s) => s.id));
  renderSourceTable([...sources], last);

  const perSec = (key) => {
    const pts = [];
    if (first.uptime && first[key] !== null) pts.push([first.t, first[key] / first.uptime]);
    for (let i = 1; i < history.length; i++) {
      const a = history[i - 1];
      const b = history[i];
      if (a[key] === null || b[key] === null) continue;
      const dt = (b.t - a.t) / 1000;
      if (dt > 0) pts.push([b.t, Math.max(0, (b[key] - a[key]) / dt)]);
    }
    return pts;
  };
  const tok = [
    // Not token sources: colours of their own, so the legend is not read as "documents" / "prediction".
    { name: "completion tokens/s", color: cssVar("--chart-tokens"), points: perSec("completionTokens") },
    { name: "requests/s", color: cssVar("--chart-requests"), points: perSec("requests"), dash: "6 3" },
  ];
  lines($("tok-chart"), tok, { label: "Completion tokens and requests per second",
                               empty: "waiting for a second poll…" });
  drawn = { acceptance: acc.map(({ id, points }) => ({ id, points })), tokens: tok[0].points, requests: tok[1].points };
  const leg = $("tok-legend");
  leg.replaceChildren();
  for (const s of tok) {
    const li = document.createElement("li");
    li.className = "legend-item";
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = s.color;
    li.append(sw, document.createTextNode(s.name));
    leg.appendChild(li);
  }
}

const DASHES = ["", "8 4", "2 3", "12 3 2 3", "4 6", "1 5", "14 6"]; // one per source: 7 sources
const pct = (r) => (Number.isFinite(r) ? `${(r * 100).toFixed(1)}%` : "–");

/** Drafted, accepted and acceptance rate per source since the server started, every source listed. */
function renderSourceTable(sources, last) {
  const table = $("acc-table");
  const tbody = table.querySelector("tbody");
  tbody.replaceChildren();
  const rows = sources.map((src) => {
    const d = (last.drafted || {})[src] || 0;
    const a = (last.accepted || {})[src] || 0;
    return { id: normSource(src), d, a };
  }).sort((x, y) => y.d - x.d);
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.dataset.source = r.id;
    const th = document.createElement("th");
    th.scope = "row";
    th.className = `src-cell src-${r.id}`;
    th.textContent = sourceLabel(r.id);
    const cells = [fmtNum(r.d), fmtNum(r.a), pct(ratio(r.a, r.d))].map((text) => {
      const td = document.createElement("td");
      td.textContent = text;
      return td;
    });
    tr.append(th, ...cells);
    tbody.appendChild(tr);
  }
  table.hidden = !rows.length;
}

export async function poll() {
  try {
    const res = await request("GET", "/metrics", { accept: "text/plain" });
    const samples = parsePrometheus(await res.text());
    // The first poll also reads the server's uptime, to chart the figures since it started right away.
    const uptime = history.length ? null : await getJSON("/health").then((h) => Number(h.uptime_s) || null, () => null);
    history.push({ t: Date.now(), uptime, ...summarize(samples) });
    if (history.length > KEEP) history.shift();
    $("metrics-status").textContent =
      `Last poll ${new Date().toLocaleTimeString()}: ${samples.length} values read from /metrics (Prometheus format).`;
    $("metrics-status").classList.remove("bad");
    render();
  } catch (err) {
    $("metrics-status").textContent = err instanceof ApiError ? err.message : `Error: ${err.message || err}`;
    $("metrics-status").classList.add("bad");
  }
}

function schedule() {
  clearInterval(timer);
  timer = null;
  const every = Number($("poll-every").value);
  if (visible && every > 0) timer = setInterval(poll, every);
}

/** The metrics view polls only while it is shown. */
export function setMetricsVisible(v) {
  visible = v;
  if (v) poll();
  schedule();
}

export function initMetrics() {
  $("poll-every").addEventListener("change", schedule);
  $("metrics-now").addEventListener("click", poll);
}
