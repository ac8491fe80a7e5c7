// Token sources (provenance) as sent by the server, with their labels and colours.
// Colours live in style.css as --src-<name>; this table only names them and orders the legend.

export const SOURCES = [
  { id: "target", label: "target (bonus / correction)", short: "target" },
  { id: "prompt", label: "prompt suffix", short: "prompt" },
  { id: "history", label: "output history", short: "history" },
  { id: "documents", label: "documents", short: "documents" },
  { id: "references", label: "references", short: "references" },
  { id: "prediction", label: "prediction", short: "prediction" },
  { id: "draft_model", label: "draft model", short: "draft model" },
];

const byId = Object.fromEntries(SOURCES.map((s) => [s.id, s]));

/** The known source id for a server-sent name ("target" for anything unknown or missing). */
export function normSource(name) {
  if (!name) return "target";
  const n = String(name).toLowerCase().replace(/-/g, "_");
  if (byId[n]) return n;
  if (n === "document" || n === "docs") return "documents";
  if (n === "reference") return "references";
  if (n === "output_history") return "history";
  if (n === "draft" || n === "draftmodel") return "draft_model";
  return "target";
}

export function sourceLabel(id) {
  return (byId[id] || byId.target).label;
}

/** The colour of a source as a CSS expression: the stylesheet's --src-<id>, so charts and text agree in
 * light and dark mode alike. */
export function sourceColor(id) {
  return `var(--src-${id}, #888)`;
}

/** Fill a <ul> legend with swatches; counts (optional) is {source: n}. */
export function renderLegend(ul, counts = null, ids = SOURCES.map((s) => s.id)) {
  ul.replaceChildren();
  for (const id of ids) {
    const li = document.createElement("li");
    li.className = `legend-item src-${id}`;
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.setAttribute("aria-hidden", "true");
    li.appendChild(sw);
    const n = counts ? counts[id] || 0 : null;
    li.appendChild(document.createTextNode(n === null ? sourceLabel(id) : `${sourceLabel(id)}: ${n}`));
    ul.appendChild(li);
  }
}
