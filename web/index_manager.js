// Index manager: list (paged, searchable), add (pasted text or uploaded files), remove, statistics.

import { ApiError, getJSON, request, sendJSON } from "./api.js";
import { fmtNum } from "./charts.js";
import { addStat } from "./dom.js";

const $ = (id) => document.getElementById(id);
const PAGE = 20;
const DOCS = "/v1/index/documents";

let page = 0;
let query = "";
let total = null;
let loadSeq = 0; // answers to older list requests (typing fast, paging) are dropped

function say(id, text, bad = false) {
  const p = $(id);
  p.textContent = text;
  p.classList.toggle("bad", bad);
}

function errText(err) {
  return err instanceof ApiError ? err.message : `Error: ${err.message || err}`;
}

/** Document fields under the names the page shows, whatever the server calls them. */
function normDoc(d) {
  const meta = d.metadata || {};
  return {
    id: d.id ?? d.doc_id ?? d.document_id,
    name: d.name || meta.name || d.source || d.source_path || d.path || meta.path || meta.source || "",
    tokens: d.num_tokens ?? d.n_tokens ?? d.tokens ?? null,
    chars: d.num_chars ?? d.n_chars ?? d.chars ?? (typeof d.text === "string" ? d.text.length : null),
    // "created" is a flag (new vs already stored) on add, a time elsewhere.
    added: d.added_at ?? d.created_at ?? d.added ?? (typeof d.created === "boolean" ? null : d.created) ?? null,
    preview: d.preview ?? (typeof d.text === "string" ? d.text.slice(0, 120) : ""),
  };
}

function fmtTime(v) {
  if (v === null || v === undefined || v === "") return "";
  const t = typeof v === "number" ? new Date(v < 1e12 ? v * 1000 : v) : new Date(v);
  return Number.isNaN(t.getTime()) ? String(v) : t.toLocaleString();
}

export async function loadDocuments() {
  const params = new URLSearchParams({ limit: String(PAGE), offset: String(page * PAGE) });
  if (query) params.set("q", query);
  const mine = ++loadSeq;
  const table = $("doc-table");
  table.setAttribute("aria-busy", "true");
  let res;
  try {
    res = await getJSON(`${DOCS}?${params}`);
  } catch (err) {
    if (mine === loadSeq) {
      say("doc-status", errText(err), true);
      table.setAttribute("aria-busy", "false");
    }
    return;
  }
  if (mine !== loadSeq) return;
  const list = res.data || res.documents || (Array.isArray(res) ? res : []);
  total = res.total ?? res.count ?? null;
  const tbody = $("doc-table").querySelector("tbody");
  tbody.replaceChildren();
  for (const raw of list) {
    const d = normDoc(raw);
    const tr = document.createElement("tr");
    tr.dataset.id = String(d.id);
    const name = document.createElement("td");
    name.className = "doc-name";
    name.textContent = d.name || `#${d.id}`;
    const size = document.createElement("td");
    size.textContent = [d.tokens, d.chars].map((v) => (v === null ? "–" : fmtNum(Number(v)))).join(" / ");
    const added = document.createElement("td");
    added.textContent = fmtTime(d.added);
    const prev = document.createElement("td");
    prev.className = "preview";
    prev.textContent = d.preview;
    const act = document.createElement("td");
    const btn = document.createElement("button");
    btn.type = "button";
    btn.className = "danger remove";
    btn.textContent = "Remove";
    btn.setAttribute("aria-label", `Remove ${d.name || `document ${d.id}`}`);
    btn.addEventListener("click", () => removeDocument(d, btn));
    act.appendChild(btn);
    tr.append(name, size, added, prev, act);
    tbody.appendChild(tr);
  }
  if (!list.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = 5;
    td.className = "empty";
    td.textContent = query ? `No document matches "${query}".` : "No documents yet.";
    tr.appendChild(td);
    tbody.appendChild(tr);
  }
  const first = list.length ? page * PAGE + 1 : 0;
  const last = page * PAGE + list.length;
  $("page-info").textContent = total !== null ? `${first}–${last} of ${total}` : `${first}–${last}`;
  $("page-prev").disabled = page === 0;
  $("page-next").disabled = total !== null ? last >= total : list.length < PAGE;
  say("doc-status", "");
  table.dataset.query = query; // what the rows shown answer (tests and assistive tech can tell)
  table.setAttribute("aria-busy", "false");
}

const HASH = /^[0-9a-f]{16,}$/i;

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function fmtValue(key, v) {
  if (typeof v === "number") return /bytes/.test(key) ? fmtBytes(v) : fmtNum(v);
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (Array.isArray(v)) return v.join(", ");
  return String(v);
}

const label = (k) => k.replace(/_/g, " ");
const isScalar = (v) => v === null || typeof v !== "object" || Array.isArray(v);

/**
 * Render the stats object: scalars as name/value pairs; {fingerprint: n} maps as one pair per
 * tokenizer; nested objects as their own titled group (a tokenizer group is titled by its path).
 */
function renderStats(box, obj, depth = 0) {
  const dl = document.createElement("dl");
  dl.className = "stats";
  box.appendChild(dl);
  const groups = [];
  for (const [k, v] of Object.entries(obj)) {
    if (isScalar(v)) addStat(dl, label(k), fmtValue(k, v));
    else if (Object.values(v).every(isScalar) && Object.keys(v).every((x) => HASH.test(x))) {
      for (const [fp, n] of Object.entries(v)) addStat(dl, `${label(k)} (tokenizer ${fp.slice(0, 8)})`, fmtValue(k, n));
    } else groups.push([k, v]);
  }
  for (const [k, v] of groups) {
    const entries = Object.keys(v).every((x) => HASH.test(x)) ? Object.entries(v) : [[k, v]];
    for (const [name, sub] of entries) {
      const h = document.createElement(depth ? "h4" : "h3");
      h.className = "stats-group";
      h.textContent = HASH.test(name)
        ? `${label(k)} ${name.slice(0, 8)}` + (sub.tokenizer ? `: ${String(sub.tokenizer).split("/").filter(Boolean).pop()}` : "")
        : label(name);
      if (sub.tokenizer) h.title = String(sub.tokenizer);
      box.appendChild(h);
      if (isScalar(sub)) addStat(dl, label(name), fmtValue(name, sub));
      else renderStats(box, sub, depth + 1);
    }
  }
}

export async function loadStats() {
  const box = $("index-stats");
  try {
    const s = await getJSON("/v1/index/stats");
    box.replaceChildren();
    renderStats(box, s);
  } catch (err) {
    box.replaceChildren();
    addStat(box.appendChild(document.createElement("dl")), "error", errText(err)).className = "bad";
  }
}

async function addDocuments(docs, statusWhat) {
  say("add-status", `Adding ${statusWhat}…`);
  try {
    const res = await sendJSON("POST", DOCS, { documents: docs });
    const added = res.data || res.documents || [];
    const list = Array.isArray(added) ? added : [];
    const fresh = list.filter((d) => d.created !== false && (!d.status || d.status === "added")).length;
    const again = list.length - fresh;
    say("add-status", `Added ${statusWhat}: ${fresh} new` + (again ? `, ${again} already indexed.` : "."));
    page = 0;
    await Promise.all([loadDocuments(), loadStats()]);
    return true;
  } catch (err) {
    say("add-status", errText(err), true);
    return false;
  }
}

async function removeDocument(d, btn) {
  btn.disabled = true;
  try {
    await request("DELETE", `${DOCS}?${new URLSearchParams({ id: String(d.id) })}`);
    say("doc-status", `Removed ${d.name || `document ${d.id}`}.`);
    await Promise.all([loadDocuments(), loadStats()]);
    say("doc-status", `Removed ${d.name || `document ${d.id}`}.`);
    $("doc-search").focus();
  } catch (err) {
    btn.disabled = false;
    say("doc-status", errText(err), true);
  }
}

export function initIndexManager() {
  $("add-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = $("doc-text").value;
    if (!text.trim()) {
      say("add-status", "Paste some text first.", true);
      $("doc-text").focus();
      return;
    }
    const name = $("doc-name").value.trim();
    const doc = { text };
    if (name) Object.assign(doc, { source: name, metadata: { name } });
    if (await addDocuments([doc], name ? `"${name}"` : "the text")) {
      $("doc-text").value = "";
      $("doc-name").value = "";
    }
  });
  $("upload-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const files = [...$("doc-files").files];
    if (!files.length) {
      say("add-status", "Choose one or more files first.", true);
      return;
    }
    const docs = await Promise.all(files.map(async (f) => ({ text: await f.text(), source: f.name, metadata: { name: f.name } })));
    if (await addDocuments(docs, `${files.length} file${files.length > 1 ? "s" : ""}`)) $("doc-files").value = "";
  });
  $("search-form").addEventListener("submit", (e) => {
    e.preventDefault();
    query = $("doc-search").value.trim();
    page = 0;
    loadDocuments();
  });
  // Search as you type, once typing pauses.
  let typing = null;
  $("doc-search").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      const q = $("doc-search").value.trim();
      if (q === query) return;
      query = q;
      page = 0;
      loadDocuments();
    }, 300);
  });
  $("page-prev").addEventListener("click", () => {
    page = Math.max(0, page - 1);
    loadDocuments();
  });
  $("page-next").addEventListener("click", () => {
    page += 1;
    loadDocuments();
  });
  $("index-refresh").addEventListener("click", () => {
    loadDocuments();
    loadStats();
  });
}

export function refreshIndex() {
  loadDocuments();
  loadStats();
}
