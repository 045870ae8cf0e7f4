// The cluster overview: nodes fully idle, partly idle and busy, allocation, utilization, faulty
// nodes (/overview), with the GPU heatmap below it.

import { get } from "../api.js";
import { card, gpus, h, pct, rate, table, when } from "../dom.js";
import * as heatmap from "./heatmap.js";

export async function render(ctx) {
  const [o, map] = await Promise.all([
    get(`clusters/${encodeURIComponent(ctx.cluster)}/overview`, { asOf: ctx.asOf }),
    heatmap.render(ctx),
  ]);
  const nodes = o.nodes || {};
  const span = o.nodes ? `window ${when(nodes.window_start)} – ${when(nodes.window_end)}` : "no window yet";
  return h(
    "section",
    { "data-testid": "overview" },
    h("h2", {}, `Cluster ${o.cluster}`, h("span", { class: "muted" }, ` · ${span}`)),
    h(
      "div",
      { class: "cards" },
      card("allocation-rate", "GPU allocation rate (now)", rate(o.now.allocation_rate)),
      card("gpus-held", "GPUs held / capacity", `${gpus(o.now.gpus_allocated)} / ${gpus(o.now.gpu_capacity)}`),
      card("pods", "GPU pods running / pending", `${o.now.pods_running} / ${o.now.pods_pending}`),
      card("utilization", "GPU utilization (window)", pct(nodes.gpu_utilization_avg)),
      card("allocation-window", "allocation rate (window mean)", rate(o.allocation?.allocation_rate_avg)),
      card("nodes-idle", "nodes fully idle", nodes.nodes_fully_idle ?? "–"),
      card("nodes-partly", "nodes partly idle", nodes.nodes_partially_idle ?? "–"),
      card("nodes-busy", "nodes busy", nodes.nodes_busy ?? "–"),
      card("nodes-faulty", "faulty nodes", o.faulty_nodes.length),
    ),
    h("h2", {}, "Faulty nodes"),
    table(
      "faulty",
      [
        ["node", (n) => n.node],
        ["reasons", (n) => n.reasons.join(", ")],
        ["GPUs lost", (n) => String(n.gpus_lost), "num"],
      ],
      o.faulty_nodes,
      "none: every node is Ready with all its GPUs",
    ),
    map,
  );
}
