// Small hand-written inline-SVG charts (no library): stacked bars and multi-line time series.

const NS = "http://www.w3.org/2000/svg";

/** An SVG element. `css` properties go through the CSSOM (the page's Content-Security-Policy refuses
 * style attributes), and may be CSS expressions such as var(--src-prompt). */
function el(name, { css = {}, ...attrs } = {}, text) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  for (const [k, v] of Object.entries(css)) node.style.setProperty(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svgRoot(width, height, label) {
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, preserveAspectRatio: "none" });
  svg.appendChild(el("title", {}, label));
  return svg;
}

// Charts are drawn at their container's width, so that text stays 11 px. When a container changes width
// (a window resized, a phone turned), it is drawn again with the same data, on the next frame: redrawing
// inside the observer would resize what it observes and make the browser report a loop.
const drawers = new WeakMap(); // container -> {width, draw}
const resized = typeof ResizeObserver === "function"
  ? new ResizeObserver((entries) => {
    for (const e of entries) {
      const d = drawers.get(e.target);
      if (d && e.target.clientWidth && Math.abs(e.target.clientWidth - d.width) >= 1) requestAnimationFrame(d.draw);
    }
  })
  : null;

function remember(container, draw) {
  drawers.set(container, { width: container.clientWidth, draw });
  if (resized) resized.observe(container);
}

function niceMax(v) {
  if (v <= 1) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

/**
 * Stacked bars. bars: [{label, parts: [{value, color, name}]}]. Fills `container` with an SVG.
 * Colours may be CSS expressions such as "var(--src-prompt)" (set as style properties, not attributes), so
 * a chart follows the page from light to dark without being drawn again.
 * Draws at most `maxBars` bars (the latest ones) so long generations stay readable.
 */
export function stackedBars(container, bars, opts = {}) {
  const { label = "bar chart", maxBars = 120, height = 120 } = opts;
  container.replaceChildren();
  remember(container, () => stackedBars(container, bars, opts));
  if (!bars.length) {
    container.appendChild(Object.assign(document.createElement("p"), { className: "empty", textContent: "no data yet" }));
    return;
  }
  const shown = bars.slice(-maxBars);
  const width = Math.max(240, container.clientWidth || 600); // user units = CSS pixels, so text stays 11px
  const padL = 28;
  const padB = 16;
  const padT = 6;
  const top = niceMax(Math.max(...shown.map((b) => b.parts.reduce((s, p) => s + p.value, 0))));
  const plotW = width - padL - 4;
  const plotH = height - padB - padT;
  const bw = Math.min(plotW / shown.length, 40); // a few steps should not give fat bars
  const svg = svgRoot(width, height, label);
  svg.setAttribute("preserveAspectRatio", "xMidYMid meet");
  for (const frac of [0, 0.5, 1]) {
    const y = padT + plotH * (1 - frac);
    svg.appendChild(el("line", { x1: padL, x2: width - 4, y1: y, y2: y, class: "grid" }));
    svg.appendChild(el("text", { x: padL - 4, y: y + 4, class: "axis", "text-anchor": "end" }, fmtNum(top * frac)));
  }
  shown.forEach((bar, i) => {
    let y = padT + plotH;
    const g = el("g");
    const total = bar.parts.reduce((s, p) => s + p.value, 0);
    g.appendChild(el("title", {}, `${bar.label}: ${total}` + bar.parts.filter((p) => p.value).map((p) => `\n${p.name}: ${p.value}`).join("")));
    for (const part of bar.parts) {
      if (!part.value) continue;
      const h = (part.value / top) * plotH;
      y -= h;
      g.appendChild(el("rect", { x: padL + i * bw + bw * 0.1, y, width: Math.max(bw * 0.8, 0.5), height: h, css: { fill: part.color } }));
    }
    svg.appendChild(g);
  });
  const first = bars.length - shown.length;
  svg.appendChild(el("text", { x: padL, y: height - 3, class: "axis" }, shown[0].label ?? String(first)));
  const xEnd = padL + shown.length * bw;
  if (shown.length > 1 && xEnd - padL > 130) {
    svg.appendChild(el("text", { x: xEnd, y: height - 3, class: "axis", "text-anchor": "end" }, shown[shown.length - 1].label ?? ""));
  }
  container.appendChild(svg);
}

/**
 * Multi-line chart. series: [{name, color, points: [[t, y], ...], dash?}] with t in ms since epoch; a
 * null y leaves a gap in the line (no value there), and a point with gaps on both sides is drawn as a dot.
 * dash: an SVG stroke-dasharray, so that lines which coincide stay visible.
 * yMax fixes the scale (e.g. 1 for rates); otherwise it follows the data. `empty`: the text shown
 * while no series has a value.
 */
export function lines(container, series, opts = {}) {
  const { label = "line chart", yMax = null, height = 180, yFormat = fmtNum, empty = "waiting for data…" } = opts;
  container.replaceChildren();
  remember(container, () => lines(container, series, opts));
  const all = series.flatMap((s) => s.points);
  const values = all.filter((p) => p[1] !== null);
  if (values.length < 1) {
    container.appendChild(Object.assign(document.createElement("p"), { className: "empty", textContent: empty }));
    return;
  }
  const width = Math.max(240, container.clientWidth || 600);
  const padL = 40;
  const padB = 18;
  const padT = 8;
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(...all.map((p) => p[0]), t0 + 1);
  const top = yMax ?? niceMax(Math.max(...values.map((p) => p[1]), 0));
  const plotW = width - padL - 6;
  const plotH = height - padB - padT;
  const x = (t) => padL + ((t - t0) / (t1 - t0)) * plotW;
  const y = (v) => padT + plotH * (1 - Math.min(v, top) / top);
  const svg = svgRoot(width, height, label);
  svg.setAttribute("preserveAspectRatio", "xMidYMid meet");
  for (const frac of [0, 0.25, 0.5, 0.75, 1]) {
    const yy = padT + plotH * (1 - frac);
    svg.appendChild(el("line", { x1: padL, x2: width - 6, y1: yy, y2: yy, class: "grid" }));
    svg.appendChild(el("text", { x: padL - 4, y: yy + 4, class: "axis", "text-anchor": "end" }, yFormat(top * frac)));
  }
  svg.appendChild(el("text", { x: padL, y: height - 4, class: "axis" }, new Date(t0).toLocaleTimeString()));
  svg.appendChild(el("text", { x: width - 6, y: height - 4, class: "axis", "text-anchor": "end" }, new Date(t1).toLocaleTimeString()));
  for (const s of series) {
    const pts = s.points;
    if (!pts.some((p) => p[1] !== null)) continue;
    // "M" starts a segment after a gap; a point alone between gaps gets a dot, or nothing would show it.
    const d = pts.map((p, i) => (p[1] === null ? "" : `${i && pts[i - 1][1] !== null ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`))
      .filter(Boolean).join(" ");
    const path = el("path", { d, fill: "none", css: { stroke: s.color }, "stroke-width": 2, ...(s.dash ? { "stroke-dasharray": s.dash } : {}) });
    path.appendChild(el("title", {}, s.name));
    svg.appendChild(path);
    pts.forEach((p, i) => {
      const alone = p[1] !== null && !(pts[i - 1] && pts[i - 1][1] !== null) && !(pts[i + 1] && pts[i + 1][1] !== null);
      const last = p[1] !== null && i === pts.length - 1;
      if (alone || last) svg.appendChild(el("circle", { cx: x(p[0]), cy: y(p[1]), r: 3, css: { fill: s.color } }));
    });
  }
  container.appendChild(svg);
}

export function fmtNum(v) {
  if (!Number.isFinite(v)) return "–";
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "k";
  if (Number.isInteger(v)) return String(v);
  return String(Number(v.toFixed(Math.abs(v) < 10 ? 2 : 1)));
}
