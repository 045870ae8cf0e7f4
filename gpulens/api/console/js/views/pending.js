// GPU pods waiting unbound (/pending), oldest first, with the scheduler's reason, why they wait
// (the worker's reason class, and whether consolidating pods would make room) and the free GPUs
// by model when their GpuPodPending alert opened.

import { get } from "../api.js";
import { age, gpus, h, table, when, workloadLink } from "../dom.js";

const why = (p) =>
  p.reason_class
    ? p.reason_class.replaceAll("_", " ") + (p.fits_after_consolidation ? " (fits after consolidation)" : "")
    : "–";

const byModel = (counts) =>
  counts ? Object.entries(counts).map(([model, n]) => `${model}: ${n}`).join(", ") || "none" : "–";

export async function render(ctx) {
  const body = await get("pending", { cluster: ctx.cluster, asOf: ctx.asOf });
  return h(
    "section",
    { "data-testid": "pending" },
    h("h2", {}, "Pending GPU pods",
      h("span", { class: "muted" }, ` · ${body.data.length} waiting at ${when(body.now)} UTC`)),
    table(
      "pending-table",
      [
        ["pod", (p) => `${p.namespace}/${p.name}`],
        ["workload", (p) => workloadLink(p.workload_uid, `${p.workload_kind}/${p.workload_name}`)],
        ["GPUs", (p) => gpus(p.gpus_requested), "num"],
        ["waiting", (p) => age(p.age_s), "num"],
        ["reason", (p) => p.reason || "–"],
        ["why", why],
        ["free GPUs when alerted", (p) => byModel(p.free_gpus)],
        ["message", (p) => p.message || ""],
      ],
      body.data,
      "no GPU pod waits",
    ),
  );
}
