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
  let res;
  try {
    res = await getJSON(`${DOCS}?${params}`);
  } catch (err) {
    say("doc-status", errText(err), true);
    return;
  }
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
}

export async function loadStats() {
  const dl = $("index-stats");
  try {
    const s = await getJSON("/v1/index/stats");
    dl.replaceChildren();
    const flat = [];
    const walk = (prefix, obj) => {
      for (const [k, v] of Object.entries(obj)) {
        const name = prefix ? `${prefix} ${k}` : k;
        if (v && typeof v === "object" && !Array.isArray(v)) walk(name, v);
        else flat.push([name, v]);
      }
    };
    walk("", s);
    for (const [k, v] of flat) {
      addStat(dl, k.replace(/_/g, " "), typeof v === "number" ? fmtNum(v) : Array.isArray(v) ? v.join(", ") : String(v));
    }
  } catch (err) {
    dl.replaceChildren();
    addStat(dl, "error", errText(err)).className = "bad";
  }
}

async function addDocuments(docs, statusWhat) {
  say("add-status", `Adding ${statusWhat}…`);
  try {
    const res = await sendJSON("POST", DOCS, { documents: docs });
    const added = res.data || res.documents || [];
    const list = Array.isArray(added) ? added : [];
    const fresh = list.filter((d) => d.created !== false).length;
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
