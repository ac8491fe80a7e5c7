// Small DOM helpers shared by the views.

/** Append one name/value pair to a <dl> (wrapped in a <div> so the grid keeps pairs together). */
export function addStat(dl, name, value, id = null) {
  const div = document.createElement("div");
  const dt = document.createElement("dt");
  dt.textContent = name;
  const dd = document.createElement("dd");
  dd.textContent = value;
  if (id) dd.id = id;
  div.append(dt, dd);
  dl.appendChild(div);
  return dd;
}
