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
    name: d.name || meta.name || baseName(d.source || d.source_path || d.path || meta.path || meta.source || ""),
    path: d.source || d.source_path || d.path || meta.path || meta.source || "",
    tokens: d.num_tokens ?? d.n_tokens ?? d.tokens ?? null,
    chars: d.num_chars ?? d.n_chars ?? d.chars ?? (typeof d.text === "string" ? d.text.length : null),
    // "created" is a flag (new vs already stored) on add, a time elsewhere.
    added: d.added_at ?? d.created_at ?? d.added ?? (typeof d.created === "boolean" ? null : d.created) ?? null,
    preview: d.preview ?? (typeof d.text === "string" ? d.text.slice(0, 120) : ""),
  };
}

const baseName = (p) => String(p).split(/[\\/]/).filter(Boolean).pop() || "";

/** The folder of a path, with its trailing separator ("" for a bare name). */
function dirName(p) {
  const m = /^(.*[\\/])[^\\/]*$/.exec(String(p || ""));
  return m ? m[1] : "";
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
    d.dir = dirName(d.path);
    const tr = document.createElement("tr");
    tr.dataset.id = String(d.id);
    const name = document.createElement("td");
    name.className = "doc-name";
    const title = document.createElement("span");
    title.className = "doc-title";
    title.textContent = d.name || "Pasted text";
    // Names repeat (__init__.py, README.md): the folder and the id tell them apart.
    const where = document.createElement("span");
    where.className = "doc-path";
    where.textContent = `id ${d.id}` + (d.dir ? ` · ${d.dir}` : "");
    if (d.path) where.title = d.path;
    name.append(title, where);
    const size = document.createElement("td");
    size.className = "size";
    size.dataset.label = "Tokens / chars";
    size.textContent = [d.tokens, d.chars].map((v) => (v === null ? "–" : fmtNum(Number(v)))).join(" / ");
    const added = document.createElement("td");
    added.className = "added";
    added.dataset.label = "Added";
    added.textContent = fmtTime(d.added);
    const prev = document.createElement("td");
    prev.className = "preview";
    prev.textContent = d.preview;
    const act = document.createElement("td");
    act.className = "row-actions";
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
    td.textContent = query ? `No document matches "${query}".`
      : "No documents yet. Add text or files above, or run `suffixspec index add PATH` where the server runs.";
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

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

const plural = (n, one, many = `${one}s`) => `${fmtNum(n)} ${n === 1 ? one : many}`;

/** A tokenizer's name for people: the folder name of a local path, a hub id as it is. */
export function tokenizerName(t) {
  const s = String(t || "");
  return /^(\/|~|[A-Za-z]:[\\/]|\.)/.test(s) ? s.split(/[\\/]/).filter(Boolean).pop() || s : s || "unknown";
}

/** One figure: a name, a value and an optional note under it (what it counts, where it comes from). */
function stat(dl, name, value, note = "") {
  const dd = addStat(dl, name, value);
  if (note) {
    const small = document.createElement("span");
    small.className = "stat-note";
    small.textContent = note;
    dd.appendChild(small);
  }
  return dd;
}

function group(box, title) {
  const h = document.createElement("h3");
  h.className = "stats-group";
  h.textContent = title;
  const dl = document.createElement("dl");
  dl.className = "stats";
  box.append(h, dl);
  return dl;
}

// Fields of GET /v1/index/stats shown by renderStats; any other field is listed under "More".
const KNOWN = new Set(["db", "documents", "document_bytes", "fingerprint", "tokenizer", "tokens", "segments",
  "pending_merges", "also_indexed_for", "bytes_on_disk", "db_bytes", "arrays_bytes", "memory_estimate_bytes",
  "tokenizers", "served"]);
const humanKey = (k) => k.replace(/_/g, " ").replace(/^./, (c) => c.toUpperCase());

/**
 * The statistics of GET /v1/index/stats in words: the corpus (each document counted once), its arrays
 * for the tokenizer this server serves (tokens, segments, whether every document is indexed for it),
 * disk, memory, and what this server holds in memory. Documents are indexed per tokenizer: the other
 * tokenizers the store indexed for are one folded line ("Also indexed for"), not figures of their own.
 * Machine paths (database, tokenizer folders) stay in a "Files" disclosure.
 * Example: {documents: 40, tokens: 81234, tokenizer: {model: "smollm2-135m-instruct", segments: [..3]}}
 *   -> "Documents 40", "Tokens 81,234 for smollm2-135m-instruct", "Segments 3".
 */
function renderStats(box, s) {
  const tokenizers = Object.entries(s.tokenizers || {});
  const t = s.tokenizer || null; // the served tokenizer's entry
  const main = document.createElement("dl");
  main.className = "stats";
  box.appendChild(main);
  if (s.documents !== undefined) {
    stat(main, "Documents", fmtNum(s.documents), s.document_bytes !== undefined ? `${fmtBytes(s.document_bytes)} of text` : "");
  }
  if (s.tokens !== undefined) {
    stat(main, "Tokens", fmtNum(Number(s.tokens) || 0), t ? `for ${tokenizerName(t.model || t.tokenizer)}` : "");
  }
  if (t) {
    const segs = t.segments || [];
    const pending = (t.pending_merges || []).length;
    stat(main, "Segments", fmtNum(segs.length), pending ? `${plural(pending, "merge")} pending` : "searched as one index");
    const missing = (s.documents ?? 0) - (t.documents_tokenized ?? 0);
    if (t.arrays_current === false && missing > 0) {
      stat(main, "Not indexed yet", plural(missing, "document"), `for ${tokenizerName(t.model || t.tokenizer)}: the next generation indexes them`);
    }
  }
  if (s.bytes_on_disk !== undefined) {
    const parts = [];
    if (s.db_bytes !== undefined) parts.push(`database ${fmtBytes(s.db_bytes)}`);
    if (s.arrays_bytes !== undefined) parts.push(`suffix arrays ${fmtBytes(s.arrays_bytes)}`);
    stat(main, "On disk", fmtBytes(s.bytes_on_disk), parts.join(" + "));
  }
  if (s.memory_estimate_bytes !== undefined) {
    stat(main, "Memory to serve", fmtBytes(s.memory_estimate_bytes), "estimate");
  }
  const others = s.also_indexed_for || [];
  if (others.length) {
    stat(main, "Also indexed for", others.map((o) => tokenizerName(o.model || o.tokenizer)).join(", "),
         "their arrays are not used by this server");
  }
  if (s.served) {
    const dl = group(box, "Loaded in this server");
    const v = s.served;
    if (v.documents_loaded_tokens !== undefined) {
      stat(dl, "Document tokens", fmtNum(v.documents_loaded_tokens),
           v.documents_pending ? "documents changed since they were loaded: the next generation loads them"
                               : "searched by the documents drafter");
    }
    if (v.history_outputs !== undefined) {
      stat(dl, "Output history", plural(v.history_outputs, "output"), `${plural(v.history_tokens ?? 0, "token")}, searched by the history drafter`);
    }
    for (const [k, val] of Object.entries(v)) {
      if (!["documents_loaded_tokens", "documents_pending", "history_outputs", "history_tokens"].includes(k)) stat(dl, humanKey(k), fmtAny(k, val));
    }
  }
  const more = Object.entries(s).filter(([k]) => !KNOWN.has(k));
  if (more.length) {
    const dl = group(box, "More");
    for (const [k, v] of more) stat(dl, humanKey(k), fmtAny(k, v));
  }
  // Where things are: paths for the operator, out of the way of the figures.
  const files = [];
  if (s.db) files.push(["Database", s.db]);
  for (const [fp, info] of tokenizers) files.push([`Tokenizer ${tokenizerName(info.tokenizer)} (fingerprint ${fp.slice(0, 12)})`, info.tokenizer]);
  if (files.length) {
    const det = document.createElement("details");
    det.className = "files";
    const sum = document.createElement("summary");
    sum.textContent = "Files";
    const dl = document.createElement("dl");
    dl.className = "paths";
    for (const [name, path] of files) addStat(dl, name, String(path));
    det.append(sum, dl);
    box.appendChild(det);
  }
}

function fmtAny(key, v) {
  if (typeof v === "number") return /bytes/.test(key) ? fmtBytes(v) : fmtNum(v);
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (v === null || v === undefined) return "–";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
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
