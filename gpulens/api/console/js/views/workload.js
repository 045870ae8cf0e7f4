// A workload's page: what it is (/workloads/UID), its tree (/hierarchy), its pods (/pods) and
// its GPUs held and utilization per window over time (/metrics), charted with uPlot.

import { get } from "../api.js";
import { gpus, h, table, when } from "../dom.js";

function branch(node) {
  const pods = node.pods.map((p) => h("li", {}, `Pod ${p.name}`, h("span", { class: "muted" }, ` ${p.phase}${p.node ? ` on ${p.node}` : ""}`)));
  return h("li", {}, h("strong", {}, node.kind), ` ${node.name}`, h("ul", {}, node.children.map(branch), pods));
}

function chart(windows) {
  const holder = h("div", { "data-testid": "workload-chart" });
  if (!windows.length) {
    holder.append(h("p", { class: "muted" }, "no window of this workload by then"));
    return holder;
  }
  const data = [
    windows.map((w) => Date.parse(w.window_start) / 1000),
    windows.map((w) => w.utilization_avg),
    windows.map((w) => w.gpus_allocated_avg),
  ];
  const options = {
    tzDate: (seconds) => uPlot.tzDate(new Date(seconds * 1000), "Etc/UTC"), // times in UTC, as elsewhere
    width: Math.min(1000, Math.max(400, document.body.clientWidth - 60)),
    height: 260,
    series: [
      {},
      { label: "utilization %", stroke: "#2563eb", width: 2, scale: "%", spanGaps: false },
      { label: "GPUs held (mean)", stroke: "#f59e0b", width: 2, scale: "gpus" },
    ],
    axes: [{}, { scale: "%", label: "utilization %" }, { scale: "gpus", side: 1, label: "GPUs", grid: { show: false } }],
    scales: { "%": { range: [0, 100] }, gpus: { range: (_u, _min, max) => [0, Math.max(1, max)] } },
  };
  new uPlot(options, data, holder);
  return holder;
}

export async function render(ctx) {
  const uid = encodeURIComponent(ctx.arg);
  const asked = { cluster: ctx.cluster, asOf: ctx.asOf };
  const [w, tree, pods, metrics] = await Promise.all([
    get(`workloads/${uid}`, asked),
    get(`workloads/${uid}/hierarchy`, asked),
    get(`workloads/${uid}/pods`, asked),
    get(`workloads/${uid}/metrics`, { cluster: ctx.cluster, end: ctx.asOf }),
  ]);
  const windows = metrics.data.filter((m) => !ctx.asOf || Date.parse(m.window_end) <= Date.parse(ctx.asOf));
  return h(
    "section",
    { "data-testid": "workload" },
    h("h2", {}, `${w.kind} ${w.namespace}/${w.name}`,
      h("span", { class: "muted" }, ` · ${w.status}, ${w.pods_running} of ${w.pods} pods hold ${gpus(w.gpus_held)} GPUs`)),
    h("h2", {}, "Utilization over time (per window)"),
    chart(windows),
    h("h2", {}, "Hierarchy"),
    h("ul", { class: "tree", "data-testid": "hierarchy" }, branch(tree)),
    h("h2", {}, "Pods"),
    table(
      "pods-table",
      [
        ["pod", (p) => `${p.namespace}/${p.name}`],
        ["phase", (p) => (p.deleted ? `${p.phase} (deleted)` : p.phase)],
        ["node", (p) => p.node || "–"],
        ["GPUs", (p) => gpus(p.gpu_amount), "num"],
        ["holds GPUs", (p) => (p.holds_gpus ? "yes" : "no")],
        ["created", (p) => when(p.creation_time)],
        ["waiting because", (p) => p.unschedulable_reason || ""],
      ],
      pods.data,
      "no pod by then",
    ),
  );
}
