// Alerts (/alerts) in their state as of the instant: open ones by default, newest change first.

import { get } from "../api.js";
import { h, table, when } from "../dom.js";

let state = "open"; // the filter chosen, kept across refreshes and views

export async function render(ctx) {
  const body = await get("alerts", { cluster: ctx.cluster, asOf: ctx.asOf, state, pageSize: 200 });
  const picker = h(
    "select",
    {
      "aria-label": "state",
      onchange: (event) => {
        state = event.target.value;
        ctx.refresh();
      },
    },
    [["open", "open"], ["resolved", "resolved"], ["", "all"]].map(([value, text]) => new Option(text, value, false, value === state)),
  );
  return h(
    "section",
    { "data-testid": "alerts" },
    h("h2", {}, "Alerts ", picker,
      h("span", { class: "muted", "data-testid": "alerts-total" }, ` ${body.total} alerts`),
      body.total > body.data.length ? h("span", { class: "muted" }, ` (newest ${body.data.length} shown)`) : null),
    table(
      "alerts-table",
      [
        ["alert", (a) => a.alert],
        ["state", (a) => h("span", { class: `state-${a.state}` }, a.state)],
        ["since", (a) => when(a.since)],
        ["entity", (a) => a.pod_name ? `${a.pod_namespace}/${a.pod_name}` : a.entity],
        ["node", (a) => a.node || "–"],
        ["message", (a) => a.message],
      ],
      body.data,
      `no ${state} alert`,
    ),
  );
}
