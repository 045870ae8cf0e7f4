// Workloads (/workloads) as of the instant, most GPUs held first: the way to a workload's page.

import { get } from "../api.js";
import { gpus, h, table, when, workloadLink } from "../dom.js";

export async function render(ctx) {
  const body = await get("workloads", { cluster: ctx.cluster, asOf: ctx.asOf, pageSize: 100 });
  return h(
    "section",
    { "data-testid": "workloads" },
    h("h2", {}, "Workloads", h("span", { class: "muted" }, ` · ${body.total} (most GPUs held first)`)),
    table(
      "workloads-table",
      [
        ["workload", (w) => workloadLink(w.uid, `${w.kind}/${w.name}`)],
        ["namespace", (w) => w.namespace],
        ["status", (w) => w.status],
        ["pods", (w) => `${w.pods_running} / ${w.pods}`, "num"],
        ["GPUs held", (w) => gpus(w.gpus_held), "num"],
        ["created", (w) => when(w.created)],
      ],
      body.data,
      "no workload by then",
    ),
  );
}
