// Playground: build an OpenAI-style request from the form, stream it, colour each token by the source
// that drafted it, show the request's speculation statistics and compare with speculation off.

import { ApiError, stream } from "./api.js";
import { fmtNum, stackedBars } from "./charts.js";
import { addStat } from "./dom.js";
import { SOURCES, normSource, renderLegend, sourceColor, sourceLabel } from "./sources.js";

const $ = (id) => document.getElementById(id);

let model = null; // model id from /v1/models, sent when known
let serverDrafters = null; // the server's drafters (from /v1/models); null until it says
let chatModel = false; // the served model has a chat template
let modeChosen = false; // the user picked a mode: what the server says no longer changes it
let controller = null; // AbortController of the running request
const chat = []; // [{role, content}] of the conversation so far

/**
 * The served model as GET /v1/models describes it: `id` (sent with each request), `chat_template`
 * (a chat model opens in Chat mode: in Prompt mode its first token is often its end-of-turn token, and
 * the output is empty) and `drafters` (only the server's drafters get a switch). A server that does not
 * send a field leaves that part of the page as it is.
 */
export function setModel(card) {
  model = card.id || null;
  if (card.chat_template !== undefined) {
    chatModel = Boolean(card.chat_template);
    if (!modeChosen) setMode(chatModel ? "chat" : "prompt");
    showMode();
  }
  if (Array.isArray(card.drafters)) {
    serverDrafters = card.drafters.map(normSource);
    showDrafters(card.drafters);
    if (!$("output").childElementCount) renderLegend($("legend"), null, legendIds());
  }
}

/** The output legend's sources: the target's own tokens and the server's drafters (all sources until the
 * server says which it has), plus any source that drafted something anyway. */
function legendIds(counts = {}) {
  return SOURCES.map((x) => x.id).filter((id) => id === "target" || !serverDrafters || serverDrafters.includes(id) || counts[id]);
}

function mode() {
  return document.querySelector('input[name="mode"]:checked').value;
}

function setMode(value) {
  for (const r of document.querySelectorAll('input[name="mode"]')) r.checked = r.value === value;
}

/** Show the box of the current mode; in Prompt mode on a chat model, say that Chat applies the template. */
function showMode() {
  const chatMode = mode() === "chat";
  $("prompt-box").hidden = chatMode;
  $("chat-box").hidden = !chatMode;
  $("mode-hint").hidden = chatMode || !chatModel;
}

/** One switch per drafter the server has; the others are hidden and off, so no request names them. */
function showDrafters(names) {
  for (const box of document.querySelectorAll('input[name="drafter"]')) {
    const have = names.includes(box.value);
    box.closest("label").hidden = !have;
    if (!have) box.checked = false;
  }
  $("prediction-note").hidden = !names.includes("prediction");
}

function numberOr(id, fallback) {
  const v = $(id).value.trim();
  if (v === "") return fallback;
  const n = Number(v);
  return Number.isFinite(n) ? n : fallback;
}

/** The request body from the form; `overrides` replaces fields (speculation: false for compare). */
export function buildPayload(overrides = {}) {
  const body = {
    max_tokens: Math.max(1, Math.round(numberOr("max-tokens", 128))),
    temperature: numberOr("temperature", 0),
    top_p: numberOr("top-p", 1),
    stream: true,
    stream_options: { include_usage: true },
  };
  if (model) body.model = model;
  const seed = numberOr("seed", null);
  if (seed !== null) body.seed = Math.round(seed);
  if (mode() === "chat") {
    const messages = [];
    const system = $("system").value;
    if (system.trim()) messages.push({ role: "system", content: system });
    messages.push(...chat);
    const user = $("user-msg").value;
    if (user.trim()) messages.push({ role: "user", content: user });
    body.messages = messages;
  } else {
    body.prompt = $("prompt").value;
  }
  const drafters = [...document.querySelectorAll('input[name="drafter"]:checked')].map((c) => c.value);
  const prediction = $("prediction").value;
  if (prediction.trim()) body.prediction = { type: "content", content: prediction };
  // A given prediction drafts whichever drafters are on (the server's rule), so with none on the
  // request still speculates, from the prediction alone.
  body.speculation = drafters.length || body.prediction
    ? { drafters, max_draft_tokens: Math.max(0, Math.round(numberOr("max-draft", 32))) }
    : false;
  const refs = $("references")
    .value.split(/^\s*---\s*$/m)
    .map((r) => r.replace(/^\n+|\n+$/g, ""))
    .filter((r) => r.trim());
  if (refs.length) body.references = refs;
  return { ...body, ...overrides };
}

function endpoint(body) {
  return body.messages ? "/v1/chat/completions" : "/v1/completions";
}

/** Text of one streamed chunk (completions or chat). */
function chunkText(chunk) {
  const choice = chunk.choices && chunk.choices[0];
  if (!choice) return "";
  if (choice.delta) return choice.delta.content || "";
  return choice.text || "";
}

/**
 * Run one streamed request. `onPiece(text, source, step)` is called per provenance piece as it arrives.
 * Returns {text, pieces, steps, stats, usage, finishReason, elapsedMs, tokens}.
 */
export async function runStream(body, { onPiece = () => {}, signal } = {}) {
  const run = { text: "", pieces: [], steps: [], stats: null, usage: null, finishReason: null };
  const t0 = performance.now();
  await stream(
    endpoint(body),
    body,
    (chunk) => {
      if (chunk.speculative_decoding) run.stats = chunk.speculative_decoding;
      if (chunk.usage) run.usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      if (choice && choice.finish_reason) run.finishReason = choice.finish_reason;
      const text = chunkText(chunk);
      let prov = Array.isArray(chunk.provenance) ? chunk.provenance : null;
      if (!prov || !prov.length) prov = text ? [{ text, source: "target" }] : [];
      if (!prov.length) {
        // The last step's chunk comes even when its tokens have no text (a chat model's end-of-turn
        // token): it is still a step, and counting it keeps chunks and steps one to one.
        if (choice && choice.finish_reason) run.steps.push({});
        return;
      }
      // One chunk per decode step: its runs, in characters per source (token counts come with the stats).
      const step = {};
      const stepIndex = run.steps.length;
      for (const p of prov) {
        const src = normSource(p.source);
        const piece = p.text || "";
        step[src] = (step[src] || 0) + piece.length;
        run.pieces.push({ text: piece, source: src, step: stepIndex });
        onPiece(piece, src, stepIndex);
      }
      run.steps.push(step);
      run.text += text || prov.map((p) => p.text || "").join("");
    },
    signal,
  );
  run.elapsedMs = performance.now() - t0;
  const s = run.stats || {};
  run.tokens = (run.usage && run.usage.completion_tokens) ?? s.output_tokens ?? run.pieces.length;
  return run;
}

// ---------------------------------------------------------------- rendering

function clearOutput() {
  $("output").replaceChildren();
  $("out-summary").textContent = "";
  $("history-note").hidden = true;
  $("gen-error").hidden = true;
  $("stats").replaceChildren();
  $("per-source").hidden = true;
  stackedBars($("step-chart"), []);
  stackedBars($("pos-chart"), []);
  renderLegend($("legend"), null, legendIds());
}

function appendPiece(text, source, step) {
  const out = $("output");
  const span = document.createElement("span");
  span.className = `tok src-${source}`;
  span.dataset.source = source;
  span.dataset.step = String(step);
  span.dataset.index = String(out.childElementCount);
  span.textContent = text;
  out.appendChild(span);
  out.scrollTop = out.scrollHeight;
}

/** Tokens per source: exact from the request's stats, else characters per source from the stream. */
function countSources(run) {
  const counts = {};
  const s = run.stats;
  if (s && s.per_source) {
    let drafted = 0;
    for (const [src, v] of Object.entries(s.per_source)) {
      const id = normSource(src);
      counts[id] = (counts[id] || 0) + (v.accepted || 0);
      drafted += v.accepted || 0;
    }
    counts.target = Math.max(0, run.tokens - drafted);
    return { counts, unit: "tokens" };
  }
  for (const st of run.steps) for (const [src, n] of Object.entries(st)) counts[src] = (counts[src] || 0) + n;
  return { counts, unit: "characters" };
}

const stat = addStat;

function cssVar(name) {
  return `var(${name}, #888)`; // resolved by the browser, so colours follow light/dark
}

function pct(v) {
  return Number.isFinite(v) ? `${(v * 100).toFixed(1)}%` : "–";
}

export function tokensPerSecond(run) {
  return run.elapsedMs > 0 ? run.tokens / (run.elapsedMs / 1000) : NaN;
}

/** Decode tokens per second by the server's clock, the prompt's prefill excluded (NaN without the stats).
 * Compare uses it: its second run reuses the first one's prompt keys and values (the prefix cache), so
 * whole-request times would favour whichever runs second. */
export function decodeTokensPerSecond(run) {
  const s = run.stats || {};
  const seconds = Number(s.time_total_s) - Number(s.time_prefill_s || 0);
  return seconds > 0 ? run.tokens / seconds : NaN;
}

function renderStats(run) {
  const dl = $("stats");
  dl.replaceChildren();
  const s = run.stats || {};
  const steps = s.steps ?? run.steps.length;
  const mean = s.mean_accepted_length ?? (steps ? run.tokens / steps : NaN);
  stat(dl, "Mean accepted length", fmtNum(Number(mean)), "stat-mal");
  stat(dl, "Acceptance rate", pct(Number(s.acceptance_rate)), "stat-rate");
  stat(dl, "Tokens/s", fmtNum(tokensPerSecond(run)), "stat-tps");
  stat(dl, "Tokens", String(run.tokens));
  stat(dl, "Steps", String(steps));
  stat(dl, "Drafted / accepted", `${s.drafted_tokens ?? "–"} / ${s.accepted_tokens ?? "–"}`, "stat-drafted");
  stat(dl, "Time (browser)", `${(run.elapsedMs / 1000).toFixed(2)} s`);
  if (s.time_total_s !== undefined) {
    const parts = ["propose", "verify", "update"]
      .filter((k) => s[`time_${k}_s`] !== undefined)
      .map((k) => `${k} ${(s[`time_${k}_s`] * 1000).toFixed(0)} ms`);
    stat(dl, "Time (server)", `${Number(s.time_total_s).toFixed(2)} s` + (parts.length ? ` (${parts.join(", ")})` : ""));
  }
  if (run.finishReason) stat(dl, "Finish", run.finishReason);
  const det = run.usage && run.usage.completion_tokens_details;
  if (det && (det.accepted_prediction_tokens !== undefined || det.rejected_prediction_tokens !== undefined)) {
    stat(dl, "Prediction tokens accepted / rejected", `${det.accepted_prediction_tokens ?? 0} / ${det.rejected_prediction_tokens ?? 0}`);
  }

  const tbody = $("per-source").querySelector("tbody");
  tbody.replaceChildren();
  const per = s.per_source || {};
  for (const [src, v] of Object.entries(per)) {
    const tr = document.createElement("tr");
    const id = normSource(src);
    const rate = v.drafted ? v.accepted / v.drafted : NaN;
    for (const [i, txt] of [sourceLabel(id), String(v.drafted ?? 0), String(v.accepted ?? 0), pct(rate)].entries()) {
      const td = document.createElement(i ? "td" : "th");
      if (!i) {
        td.scope = "row";
        td.className = `src-cell src-${id}`;
      }
      td.textContent = txt;
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
  $("per-source").hidden = !Object.keys(per).length;

  // Per draft depth: steps that accepted it, and steps that drafted that deep but had it rejected.
  const acc = s.accepted_per_position || [];
  const dra = s.drafted_per_position || [];
  stackedBars(
    $("pos-chart"),
    Array.from({ length: Math.max(acc.length, dra.length) }, (_, i) => ({
      label: `depth ${i + 1}`,
      parts: [
        { value: Number(acc[i]) || 0, color: cssVar("--chart-accepted"), name: "accepted" },
        { value: Math.max(0, (Number(dra[i]) || 0) - (Number(acc[i]) || 0)), color: cssVar("--chart-rejected"), name: "rejected" },
      ],
    })),
    { label: "Accepted and rejected draft tokens by draft position" },
  );
}

/**
 * Split a step's accepted draft tokens over the sources its chunk showed, in proportion to their
 * characters (the stream carries text runs, not token counts). {prompt: 3} for "accepted 3, all prompt".
 */
function splitAccepted(n, chars) {
  const srcs = Object.entries(chars).filter(([src, c]) => src !== "target" && c > 0);
  const out = {};
  if (!n) return out;
  if (!srcs.length) return { drafted: n };
  const total = srcs.reduce((a, [, c]) => a + c, 0);
  let left = n;
  srcs.sort((a, b) => b[1] - a[1]);
  for (const [src, c] of srcs) {
    const k = Math.min(left, Math.round((n * c) / total));
    out[src] = k;
    left -= k;
  }
  if (left > 0) out[srcs[0][0]] += left;
  return out;
}

const UNKNOWN_LABEL = "drafted, source not known";

/** The step chart's bars: tokens per step by source, exact from the stats' `sources_per_step`; from
 * an older server, split by the characters of the step's chunk, and a step whose drafted tokens cannot be
 * told apart by source (its text came in another step's chunk) is `unknown` (drawn in its own colour).
 * Returns {bars, unknown}. */
export function stepBars(run) {
  const ids = SOURCES.map((x) => x.id).filter((id) => id !== "target");
  const perStep = (run.stats && run.stats.accepted_per_step) || null;
  let bars;
  let unknown = false;
  const bySource = run.stats && run.stats.sources_per_step;
  if (perStep && Array.isArray(bySource) && bySource.length === perStep.length) {
    // Exact: each step's accepted draft tokens by source, from the stats (whatever the chunks held).
    bars = bySource.map((counts, i) => {
      const split = {};
      for (const [src, n] of Object.entries(counts || {})) split[normSource(src)] = (split[normSource(src)] || 0) + n;
      return {
        label: `step ${i + 1}`,
        parts: [
          ...ids.map((id) => ({ value: split[id] || 0, color: sourceColor(id), name: sourceLabel(id) })),
          { value: 1, color: sourceColor("target"), name: sourceLabel("target") },
        ],
      };
    });
  } else if (perStep) {
    // Exact accepted lengths from the stats; sources from the matching chunk when chunks and steps line up.
    // Sources per step: from the matching chunk when chunks and steps line up one to one (a step whose
    // text is held back, e.g. half a UTF-8 character, breaks that), or from the only source there was.
    const aligned = run.steps.length === perStep.length;
    const used = Object.entries(run.stats.per_source || {}).filter(([, v]) => v.accepted).map(([k]) => normSource(k));
    bars = perStep.map((n, i) => {
      let split = aligned ? splitAccepted(n, run.steps[i]) : { drafted: n };
      if (split.drafted && used.length === 1) split = { [used[0]]: n }; // only one source could have drafted it
      unknown ||= Boolean(split.drafted);
      return {
        label: `step ${i + 1}`,
        parts: [
          ...ids.map((id) => ({ value: split[id] || 0, color: sourceColor(id), name: sourceLabel(id) })),
          { value: split.drafted || 0, color: cssVar("--chart-drafted"), name: UNKNOWN_LABEL },
          { value: 1, color: sourceColor("target"), name: sourceLabel("target") },
        ],
      };
    });
  } else {
    // No stats (e.g. an older server): characters per step instead of tokens.
    bars = run.steps.map((st, i) => ({
      label: `step ${i + 1}`,
      parts: [...ids, "target"].map((id) => ({ value: st[id] || 0, color: sourceColor(id), name: sourceLabel(id) })),
    }));
  }
  return { bars, unknown };
}

/** Draw the step chart; an `unknown` step adds its colour to the legend. */
function renderSteps(run) {
  const { bars, unknown } = stepBars(run);
  stackedBars($("step-chart"), bars, { label: "Tokens per decoding step, by source" });
  if (unknown) {
    const li = document.createElement("li");
    li.className = "legend-item src-unknown";
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.setAttribute("aria-hidden", "true");
    li.append(sw, document.createTextNode(`${UNKNOWN_LABEL} (step chart)`));
    $("legend").appendChild(li);
  }
}

function renderSummary(run) {
  const { counts, unit } = countSources(run);
  renderLegend($("legend"), counts, legendIds(counts));
  const steps = (run.stats && run.stats.steps) ?? run.steps.length;
  const drafted = Object.entries(counts).reduce((a, [src, n]) => a + (src === "target" ? 0 : n), 0);
  $("out-summary").textContent =
    `${run.tokens} tokens in ${steps} steps; ${drafted} ${unit} came from drafts ` +
    `(${fmtNum(tokensPerSecond(run))} tokens/s).`;
  const note = historyNote(counts, unit, run.tokens);
  $("history-note").textContent = note;
  $("history-note").hidden = !note;
}

/** What to say when the output history drafted part of the result: it repeats an earlier answer, so its
 * speed is not what fresh text gets ("" when the history drafted nothing). */
export function historyNote(counts, unit, tokens) {
  const n = counts.history || 0;
  if (!n) return "";
  const share = unit === "tokens" && tokens ? ` (${Math.round((100 * n) / tokens)}% of the output)` : "";
  return `${n} ${unit}${share} were drafted from the output history: an earlier answer to a similar request. ` +
    "A repeated request runs this fast; fresh text drafts less.";
}

function showError(err) {
  const box = $("gen-error");
  if (err && err.name === "AbortError") {
    box.textContent = "Stopped.";
  } else {
    box.textContent = err instanceof ApiError ? err.message : `Error: ${err && err.message ? err.message : err}`;
  }
  box.hidden = false;
}

function setBusy(busy) {
  for (const id of ["generate", "compare"]) $(id).disabled = busy;
  $("stop").disabled = !busy;
  $("output").setAttribute("aria-busy", String(busy));
}

// ---------------------------------------------------------------- actions

async function generate({ compare = false } = {}) {
  if (controller) return;
  const body = buildPayload();
  if (body.messages && !body.messages.some((m) => m.role === "user")) {
    showError(new Error("Write a message first."));
    return;
  }
  if (compare && body.seed === undefined && body.temperature > 0) {
    // Seeded sampling makes both runs comparable token for token.
    body.seed = Math.floor(Math.random() * 2 ** 31);
  }
  clearOutput();
  $("compare-panel").hidden = !compare;
  $("compare-result").textContent = compare ? "Running with speculation…" : "";
  controller = new AbortController();
  setBusy(true);
  let run = null;
  try {
    run = await runStream(body, { onPiece: appendPiece, signal: controller.signal });
    renderSummary(run);
    renderSteps(run);
    renderStats(run);
    if (body.messages) {
      const user = $("user-msg").value;
      if (user.trim()) chat.push({ role: "user", content: user });
      chat.push({ role: "assistant", content: run.text });
      $("user-msg").value = "";
      renderChat();
    }
    if (compare) {
      $("compare-result").textContent = "Running the same request with speculation off…";
      const plainBody = { ...body, speculation: false };
      const plain = await runStream(plainBody, { signal: controller.signal });
      renderCompare(run, plain, body.seed);
    }
  } catch (err) {
    if (run) renderSummary(run);
    showError(err);
    if (compare) $("compare-result").textContent = "Compare did not finish.";
  } finally {
    controller = null;
    setBusy(false);
  }
}

function renderCompare(spec, plain, seed) {
  const box = $("compare-result");
  box.replaceChildren();
  // Decode tokens/s (the server's clock, prefill excluded), so neither a different output length nor the
  // second run's reuse of the first one's prompt skews it; the browser's clock where the stats are missing.
  const decode = Number.isFinite(decodeTokensPerSecond(spec)) && Number.isFinite(decodeTokensPerSecond(plain));
  const sTps = decode ? decodeTokensPerSecond(spec) : tokensPerSecond(spec);
  const pTps = decode ? decodeTokensPerSecond(plain) : tokensPerSecond(plain);
  const speedup = sTps / pTps;
  const identical = spec.text === plain.text;
  const dl = document.createElement("dl");
  dl.className = "stats";
  stat(dl, "Speedup", Number.isFinite(speedup) ? `${speedup.toFixed(2)}×` : "–", "speedup");
  const per = decode ? "decode tokens/s" : "tokens/s";
  stat(dl, "Speculative", `${fmtNum(sTps)} ${per} (${spec.tokens} tokens, ${(spec.elapsedMs / 1000).toFixed(2)} s)`);
  stat(dl, "Plain", `${fmtNum(pTps)} ${per} (${plain.tokens} tokens, ${(plain.elapsedMs / 1000).toFixed(2)} s)`);
  stat(dl, "Outputs", identical ? "identical" : "different", "identical");
  if (seed !== undefined) stat(dl, "Seed", String(seed));
  box.appendChild(dl);
  $("identical").className = identical ? "good" : "bad";
  if (!identical) {
    let i = 0;
    while (i < spec.text.length && spec.text[i] === plain.text[i]) i++;
    const p = document.createElement("p");
    p.textContent = `First difference at character ${i}: speculative ${JSON.stringify(spec.text.slice(i, i + 30))} vs plain ${JSON.stringify(plain.text.slice(i, i + 30))}.`;
    box.appendChild(p);
  }
}

function renderChat() {
  const log = $("chat-log");
  log.replaceChildren();
  for (const m of chat) {
    const div = document.createElement("div");
    div.className = `msg ${m.role}`;
    const who = document.createElement("strong");
    who.textContent = `${m.role}: `;
    div.append(who, document.createTextNode(m.content));
    log.appendChild(div);
  }
  log.hidden = !chat.length;
}

// ---------------------------------------------------------------- tooltip

function describe(span) {
  const out = $("output");
  const idx = Number(span.dataset.index);
  return `${sourceLabel(span.dataset.source)} · chunk ${Number(span.dataset.step) + 1} · piece ${idx + 1} of ${out.childElementCount}\n${JSON.stringify(span.textContent)}`;
}

function showTip(span) {
  const tip = $("tooltip");
  tip.textContent = describe(span);
  tip.hidden = false;
  const r = span.getBoundingClientRect();
  const tw = tip.offsetWidth;
  const left = Math.min(Math.max(4, r.left + window.scrollX), window.scrollX + document.documentElement.clientWidth - tw - 4);
  tip.style.left = `${left}px`;
  tip.style.top = `${r.bottom + window.scrollY + 6}px`;
}

function hideTip() {
  $("tooltip").hidden = true;
}

function setupTooltip() {
  const out = $("output");
  out.addEventListener("mouseover", (e) => {
    if (e.target.classList.contains("tok")) showTip(e.target);
  });
  out.addEventListener("mouseleave", hideTip);
  // Keyboard: with the output focused, Left/Right walk the tokens and show the same tooltip.
  let cursor = -1;
  out.addEventListener("keydown", (e) => {
    const toks = out.children;
    if (!toks.length || !["ArrowLeft", "ArrowRight", "Home", "End", "Escape"].includes(e.key)) return;
    e.preventDefault();
    if (toks[cursor]) toks[cursor].classList.remove("cursor");
    if (e.key === "Escape") {
      cursor = -1;
      hideTip();
      return;
    }
    if (e.key === "ArrowRight") cursor = Math.min(cursor + 1, toks.length - 1);
    if (e.key === "ArrowLeft") cursor = Math.max(cursor - 1, 0);
    if (e.key === "Home") cursor = 0;
    if (e.key === "End") cursor = toks.length - 1;
    toks[cursor].classList.add("cursor");
    toks[cursor].scrollIntoView({ block: "nearest" });
    showTip(toks[cursor]);
    out.setAttribute("aria-label", `Token ${cursor + 1}: ${describe(toks[cursor])}`);
  });
  out.addEventListener("blur", () => {
    hideTip();
    for (const t of out.querySelectorAll(".cursor")) t.classList.remove("cursor");
    cursor = -1;
  });
}

// ---------------------------------------------------------------- wiring

export function initPlayground() {
  renderLegend($("legend"));
  stackedBars($("step-chart"), []);
  stackedBars($("pos-chart"), []);
  renderChat();
  showMode();
  for (const r of document.querySelectorAll('input[name="mode"]')) {
    r.addEventListener("change", () => {
      modeChosen = true;
      showMode();
    });
  }
  $("gen-form").addEventListener("submit", (e) => {
    e.preventDefault();
    generate();
  });
  $("gen-form").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      generate();
    }
  });
  $("compare").addEventListener("click", () => generate({ compare: true }));
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("chat-clear").addEventListener("click", () => {
    chat.length = 0;
    renderChat();
  });
  setupTooltip();
}
