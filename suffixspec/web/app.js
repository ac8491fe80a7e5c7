// Entry point: tabs, the API key (sessionStorage), server status, and the three views.

import { ApiError, getJSON, getKey, onAuthError, setKey } from "./api.js";
import { initIndexManager, refreshIndex } from "./index_manager.js";
import { initMetrics, setMetricsVisible } from "./metrics.js";
import { initPlayground, setModel } from "./playground.js";

const $ = (id) => document.getElementById(id);
const TABS = ["playground", "index", "metrics"];

function showBanner(text) {
  const b = $("auth-banner");
  b.textContent = text;
  b.hidden = !text;
}

function selectTab(name, focus = false) {
  for (const t of TABS) {
    const on = t === name;
    const tab = $(`tab-${t}`);
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(`view-${t}`).hidden = !on;
    if (on && focus) tab.focus();
  }
  if (name === "index") refreshIndex();
  setMetricsVisible(name === "metrics");
  if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
}

function initTabs() {
  for (const t of TABS) {
    const tab = $(`tab-${t}`);
    tab.addEventListener("click", () => selectTab(t));
    // WAI-ARIA tabs: arrows move between tabs, Home/End jump to the ends.
    tab.addEventListener("keydown", (e) => {
      const i = TABS.indexOf(t);
      const next = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: TABS.length - 1 }[e.key];
      if (next === undefined) return;
      e.preventDefault();
      selectTab(TABS[(next + TABS.length) % TABS.length], true);
    });
  }
}

/** Ask the server who it is and whether the key works; reports in the header. */
async function checkServer() {
  const status = $("server-status");
  try {
    const health = await getJSON("/health");
    status.textContent = health.status ? `server ${health.status}` : "server up";
    status.className = "server-status good";
  } catch (err) {
    status.textContent = err instanceof ApiError && err.status ? `server: HTTP ${err.status}` : "server unreachable";
    status.className = "server-status bad";
  }
  try {
    const models = await getJSON("/v1/models");
    const card = (models.data && models.data[0]) || {};
    const id = card.id;
    if (id) {
      setModel(card);
      // Local model paths are long: show the last part, the whole id on hover.
      status.textContent += ` · ${id.split("/").filter(Boolean).pop() || id}`;
      status.title = `model ${id}`;
    }
    showBanner("");
    $("key-state").textContent = getKey() ? "key accepted" : "";
    $("key-state").className = "key-state good";
    return true;
  } catch (err) {
    if (!(err instanceof ApiError && err.isAuth)) {
      $("key-state").textContent = "";
    }
    return false;
  }
}

/** "Forget" only while a key is kept. */
function showForget() {
  $("key-forget").hidden = !getKey();
}

function initKey() {
  const input = $("api-key");
  input.value = getKey();
  showForget();
  onAuthError((_status, message) => {
    showBanner(message);
    $("key-state").textContent = getKey() ? "key rejected" : "key needed";
    $("key-state").className = "key-state bad";
  });
  $("key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    setKey(input.value.trim());
    showForget();
    $("key-state").textContent = "checking…";
    $("key-state").className = "key-state";
    if (await checkServer()) {
      if (!$("view-index").hidden) refreshIndex();
    }
  });
  $("key-forget").addEventListener("click", () => {
    setKey("");
    showForget();
    input.value = "";
    input.focus(); // the button just hid itself: keep the keyboard user in the form
    $("key-state").textContent = "key forgotten";
    $("key-state").className = "key-state";
    showBanner("");
  });
}

initTabs();
initKey();
initPlayground();
initIndexManager();
initMetrics();
selectTab(TABS.includes(location.hash.slice(1)) ? location.hash.slice(1) : "playground");
checkServer();
