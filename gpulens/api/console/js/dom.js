// Small DOM and formatting helpers the views share.

import { href } from "./route.js";

/** An element: h("td", {class: "num"}, "3"); attributes starting with "on" are listeners. */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  node.append(...children.flat().filter((c) => c !== undefined && c !== null));
  return node;
}

const dash = "–";

/** A number with `digits` decimals, or a dash. */
export function num(value, digits) {
  return value === null || value === undefined ? dash : value.toFixed(digits);
}

/** A count of GPUs: whole, or to two decimals (pods may hold a share of one). */
export function gpus(value) {
  if (value === null || value === undefined) return dash;
  return Number.isInteger(value) ? String(value) : value.toFixed(2);
}

/** A fraction (0..1) as a percentage. */
export function rate(fraction) {
  return fraction === null || fraction === undefined ? dash : `${(fraction * 100).toFixed(1)} %`;
}

/** A utilization already in % (0..100). */
export function pct(value) {
  return value === null || value === undefined ? dash : `${value.toFixed(1)} %`;
}

/** An RFC 3339 instant as "2023-02-01 12:00:00" (UTC). */
export function when(iso) {
  return iso ? iso.replace("T", " ").replace(/(\.\d+)?(Z|\+00:00)$/, "") : dash;
}

/** Seconds as "3 h 12 min". */
export function age(seconds) {
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  return hours < 48 ? `${hours} h ${minutes % 60} min` : `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** A table: columns are [label, cell(row), "num"?]; an empty list says `empty` instead. */
export function table(name, columns, rows, empty = "nothing") {
  if (!rows.length) return h("p", { class: "muted", "data-testid": `${name}-empty` }, empty);
  return h(
    "table",
    { "data-testid": name },
    h("thead", {}, h("tr", {}, columns.map(([label, , kind]) => h("th", { class: kind }, label)))),
    h(
      "tbody",
      {},
      rows.map((row) => h("tr", {}, columns.map(([, cell, kind]) => h("td", { class: kind }, cell(row))))),
    ),
  );
}

/** A card of the overview: a label and its value. */
export function card(name, label, value) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label),
    h("div", { class: "value", "data-testid": name }, value));
}

/** A link to a workload's page. */
export function workloadLink(uid, text) {
  return h("a", { href: href("workload", uid) }, text);
}
