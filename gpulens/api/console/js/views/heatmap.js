// The GPU heatmap (/gpuHeatmap): a tile per node, a cell per GPU, coloured by the mean
// utilization of the bucket the slider picks; the hour before "as of" (or the newest sample).

import { get } from "../api.js";
import { h, pct, when } from "../dom.js";

const STEP_S = 300;
const SPAN_MS = 3_600_000;
let picked = null; // the bucket the user slid to: kept across live refreshes while it is in range

/** Blue when idle, through green, to orange when busy; grey without samples. */
function colour(utilization) {
  if (utilization === null || utilization === undefined) return "#d1d5db";
  const u = Math.max(0, Math.min(100, utilization));
  return `hsl(${210 - u * 1.7} 70% ${92 - u * 0.45}%)`;
}

export async function render(ctx) {
  const end = ctx.asOf ? new Date(ctx.asOf) : null;
  const body = await get(`clusters/${encodeURIComponent(ctx.cluster)}/gpuHeatmap`, {
    step: STEP_S,
    end: end?.toISOString(),
    start: end && new Date(end - SPAN_MS).toISOString(),
  });
  const section = h("section", { "data-testid": "heatmap" }, h("h2", {}, "GPU heatmap"));
  if (!body.data.length) {
    section.append(h("p", { class: "muted", "data-testid": "heatmap-empty" },
      `no GPU samples from ${when(body.start)} to ${when(body.end)}`));
    return section;
  }
  const times = [...new Set(body.data.map((c) => c.time))].sort();
  const cells = new Map(body.data.map((c) => [`${c.node}/${c.gpu_index}/${c.time}`, c]));
  const nodes = [...new Set(body.data.map((c) => c.node))].sort();
  const gpus = Math.max(...body.data.map((c) => c.gpu_index)) + 1;
  const grid = h("div", { class: "heatmap" });
  const label = h("span", { "data-testid": "heatmap-time" });
  const at = times.includes(picked) ? times.indexOf(picked) : times.length - 1;
  const slider = h("input", { type: "range", min: 0, max: times.length - 1, value: at, "aria-label": "time" });

  function paint() {
    const time = times[slider.value];
    label.textContent = `${when(time)} UTC (${STEP_S} s mean)`;
    grid.replaceChildren();
    for (const node of nodes) {
      const row = h("div", { class: "node", "data-testid": "heatmap-row" }, h("span", { title: node }, node));
      for (let gpu = 0; gpu < gpus; gpu++) {
        const cell = cells.get(`${node}/${gpu}/${time}`);
        const text = cell ? `GPU ${gpu}: ${pct(cell.utilization)} (${cell.samples} samples)` : `GPU ${gpu}: no samples`;
        row.append(h("i", { class: "cell", title: text, style: `background: ${colour(cell?.utilization)}` }));
      }
      grid.append(row);
    }
  }
  slider.addEventListener("input", () => {
    picked = Number(slider.value) === times.length - 1 ? null : times[slider.value]; // the newest follows live
    paint();
  });
  paint();
  section.append(
    h("div", { class: "slider" }, slider, label),
    h("p", { class: "muted" }, `${nodes.length} nodes × ${gpus} GPUs · utilization 0 `, h("span", { class: "legend" }), " 100 %"),
    grid,
  );
  return section;
}
