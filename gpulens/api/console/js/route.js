// The console's address: #/VIEW[/ARG]?cluster=NAME&asOf=RFC3339. Everything a view shows follows
// from it, so a link (or a reload) shows the same cluster at the same instant.

/** {view, arg, cluster, asOf} of the current address (asOf "" means live). */
export function current() {
  const [path, query = ""] = location.hash.replace(/^#\/?/, "").split("?");
  const [view = "", ...rest] = path.split("/");
  const params = new URLSearchParams(query);
  return {
    view: view || "overview",
    arg: rest.length ? decodeURIComponent(rest.join("/")) : "",
    cluster: params.get("cluster") || "",
    asOf: params.get("asOf") || "",
  };
}

/** The address of `view` (and `arg`) with the current cluster and asOf, changed by `changes`. */
export function href(view, arg = "", changes = {}) {
  const { cluster, asOf } = { ...current(), ...changes };
  const query = new URLSearchParams();
  if (cluster) query.set("cluster", cluster);
  if (asOf) query.set("asOf", asOf);
  const path = arg ? `${view}/${encodeURIComponent(arg)}` : view;
  return `#/${path}${query.size ? `?${query}` : ""}`;
}

/** Go to the current view with `changes` (cluster, asOf) applied. */
export function go(changes) {
  const { view, arg } = current();
  location.hash = href(view, arg, changes);
}
