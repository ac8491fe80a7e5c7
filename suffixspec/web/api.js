// HTTP helpers: the API key (kept for the browser session), JSON calls, and an SSE reader for
// OpenAI-style streams ("data: {json}\n\n" ... "data: [DONE]").

const KEY_STORAGE = "suffixspec.apiKey";
const authListeners = [];

export function getKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

/** Called with (status, message) whenever the server rejects the key (401/403). */
export function onAuthError(fn) {
  authListeners.push(fn);
}

/** An HTTP error with the server's OpenAI-style message. */
export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
  get isAuth() {
    return this.status === 401 || this.status === 403;
  }
}

function headers(extra = {}) {
  const h = { ...extra };
  const key = getKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

/** A human sentence for an auth failure, depending on whether a key was given. */
export function authMessage(status) {
  if (!getKey()) {
    return `The server needs an API key (HTTP ${status}). Enter it in the "API key" field at the top and press "Use key".`;
  }
  return `Wrong API key: the server rejected it (HTTP ${status}). Check the key in the "API key" field at the top.`;
}

async function errorFrom(res) {
  let body = null;
  let message = `${res.status} ${res.statusText}`;
  try {
    const text = await res.text();
    try {
      body = JSON.parse(text);
      const err = body && body.error;
      message = (err && (err.message || err)) || body.message || message;
      if (typeof message !== "string") message = JSON.stringify(message);
    } catch {
      if (text && text.length < 300) message = text;
    }
  } catch {
    /* body unreadable: keep the status line */
  }
  const e = new ApiError(res.status, message, body);
  if (e.isAuth) {
    e.message = authMessage(res.status);
    for (const fn of authListeners) fn(res.status, e.message);
  }
  return e;
}

/** fetch() with the API key; throws ApiError on a non-2xx answer. */
export async function request(method, url, { json, body, signal, accept } = {}) {
  const init = { method, headers: headers(accept ? { Accept: accept } : {}), signal };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (body !== undefined) {
    init.body = body;
  }
  let res;
  try {
    res = await fetch(url, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, `Cannot reach the server (${err.message}).`, null);
  }
  if (!res.ok) throw await errorFrom(res);
  return res;
}

export async function getJSON(url, opts = {}) {
  const res = await request("GET", url, opts);
  return res.json();
}

export async function sendJSON(method, url, json, opts = {}) {
  const res = await request(method, url, { ...opts, json });
  const text = await res.text();
  return text ? JSON.parse(text) : {};
}

/**
 * POST a streaming request and call onChunk(obj) for each SSE data event until [DONE].
 * Resolves when the stream ends; rejects with ApiError on an HTTP error or an in-stream error.
 */
export async function stream(url, payload, onChunk, signal) {
  const res = await request("POST", url, { json: payload, signal, accept: "text/event-stream" });
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    // Events end with a blank line; tolerate \r\n line endings.
    buf = buf.replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      let obj;
      try {
        obj = JSON.parse(data);
      } catch {
        continue; // a malformed event is skipped rather than ending the stream
      }
      if (obj.error) {
        const msg = typeof obj.error === "string" ? obj.error : obj.error.message || JSON.stringify(obj.error);
        throw new ApiError(Number.isInteger(obj.error.status) ? obj.error.status : 500, msg, obj);
      }
      onChunk(obj);
    }
  }
}
