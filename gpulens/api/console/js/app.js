// The console's shell: the header (cluster, "as of", token), the views by address, live refresh.
//
// Every view is a module exporting render(ctx) -> element, where ctx holds the cluster, asOf
// ("" = live), the address's argument and refresh() (render again, e.g. on a filter's change);
// it asks the API itself (js/api.js). While "as of" is live the view is asked again every
// REFRESH_MS; when ClickHouse is unavailable (503), or the API does not answer at all, it is
// asked again every RETRY_MS, whatever the instant, and what was shown stays meanwhile.

import { ApiError, get, saveToken, token } from "./api.js";
import { current, go, href } from "./route.js";
import * as alerts from "./views/alerts.js";
import * as heatmap from "./views/heatmap.js";
import * as idle from "./views/idle.js";
import * as overview from "./views/overview.js";
import * as pending from "./views/pending.js";
import * as workload from "./views/workload.js";
import * as workloads from "./views/workloads.js";

const VIEWS = { overview, heatmap, idle, pending, alerts, workloads, workload };
const REFRESH_MS = 10_000;
const RETRY_MS = 5_000;

const $ = (id) => document.getElementById(id);
let generation = 0; // the newest render; an older one that ends late is dropped
let timer = null;

function problem(text) {
  $("problem").hidden = !text;
  $("problem").textContent = text || "";
}

function explain(err) {
  if (err instanceof ApiError && err.status === 401) {
    return token()
      ? "401: the API refused this token. Enter api.token above and save."
      : "401: this API needs its token. Enter api.token above and save.";
  }
  if (err instanceof ApiError && err.status === 503) return "ClickHouse unavailable, retrying";
  if (err instanceof ApiError && err.status === 0) return `${err.message}, retrying`;
  return `Error: ${err.message}`;
}

/** The datetime-local field's value (UTC) as RFC 3339, and back. */
const toRfc3339 = (local) => (local ? `${local.length === 16 ? `${local}:00` : local}Z` : "");
const toLocal = (rfc3339) => rfc3339.replace(/(\.\d+)?Z$/, "").slice(0, 19);

async function clusters(state) {
  const { data } = await get("clusters", { asOf: state.asOf });
  const select = $("cluster");
  select.replaceChildren(...data.map((c) => new Option(`${c.name} (${c.nodes} nodes)`, c.name)));
  if (!data.length) return "";
  const largest = data.reduce((a, b) => (b.gpu_capacity > a.gpu_capacity ? b : a)); // the default
  const chosen = data.some((c) => c.name === state.cluster) ? state.cluster : largest.name;
  select.value = chosen;
  return chosen;
}

async function render() {
  const mine = ++generation;
  clearTimeout(timer);
  const state = current();
  const view = VIEWS[state.view] || overview;
  $("as-of").value = toLocal(state.asOf);
  for (const link of document.querySelectorAll("nav a")) {
    link.href = href(link.dataset.view);
    link.classList.toggle("current", link.dataset.view === state.view);
  }
  let retry = null;
  try {
    const cluster = await clusters(state);
    if (!cluster) throw new Error("no cluster has nodes yet");
    if (cluster !== state.cluster) {
      go({ cluster }); // the address names the cluster shown; hashchange renders it
      return;
    }
    const shown = await view.render({ ...state, cluster, refresh: render });
    if (mine !== generation) return;
    $("view").replaceChildren(shown);
    problem("");
    const at = new Date().toISOString().slice(11, 19);
    $("refreshed").textContent = state.asOf ? `as of ${state.asOf}` : `live, refreshed ${at} UTC`;
  } catch (err) {
    if (mine !== generation) return;
    problem(explain(err));
    if (err instanceof ApiError && [0, 503].includes(err.status)) retry = RETRY_MS;
    else $("view").replaceChildren();
  }
  if (!state.asOf) retry ??= REFRESH_MS;
  if (retry) timer = setTimeout(render, retry);
}

$("as-of").addEventListener("change", (event) => go({ asOf: toRfc3339(event.target.value) }));
$("live").addEventListener("click", () => go({ asOf: "" }));
$("cluster").addEventListener("change", (event) => go({ cluster: event.target.value }));
$("token").value = token();
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  saveToken($("token").value.trim());
  render();
});
window.addEventListener("hashchange", render);
render();
