// Top idle workloads (/idleWorkloads): GPU-hours held but idle, the waste to look at first.

import { get } from "../api.js";
import { h, num, pct, table, workloadLink } from "../dom.js";

const TOP = 25;

export async function render(ctx) {
  const body = await get(`clusters/${encodeURIComponent(ctx.cluster)}/idleWorkloads`, {
    asOf: ctx.asOf,
    pageSize: TOP,
  });
  return h(
    "section",
    { "data-testid": "idle" },
    h("h2", {}, "Top idle workloads",
      h("span", { class: "muted" }, ` · GPU-hours held × (1 − utilization), ${body.total} workloads`)),
    table(
      "idle-table",
      [
        ["workload", (w) => workloadLink(w.uid, `${w.kind}/${w.name}`)],
        ["namespace", (w) => w.namespace],
        ["idle GPU-hours", (w) => num(w.idle_gpu_hours, 2), "num"],
        ["GPU-hours held", (w) => num(w.gpu_hours, 2), "num"],
        ["mean utilization", (w) => pct(w.utilization_avg), "num"],
        ["windows", (w) => String(w.windows), "num"],
      ],
      body.data,
      "no workload held GPUs with samples by then",
    ),
  );
}
