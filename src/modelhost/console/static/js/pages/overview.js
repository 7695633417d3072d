// Overview: balance, credits per day (compute vs storage), deployments with their live state.
import { api } from "../api.js";
import { badge, h, replace } from "../dom.js";
import { plot } from "../plot.js";

export async function render(main) {
  const balance = h("div", { class: "big", id: "balance" }, "…");
  const usagePlot = h("div", { id: "usage-plot" });
  const rows = h("tbody");
  replace(main,
    h("h2", {}, "Overview"),
    h("section", { class: "card" }, h("h3", {}, "Credit balance"), balance, h("h3", {}, "Credits per day (last 30 days)"), usagePlot),
    h("section", { class: "card" }, h("h3", {}, "Deployments"),
      h("table", { id: "overview-deployments" }, h("thead", {}, h("tr", {}, ["Model", "Task", "State", "Readiness", "Replicas", "Memory (GB)"].map((t) => h("th", {}, t)))), rows)));

  const start = new Date(Date.now() - 30 * 86400e3).toISOString();
  const usage = await api("GET", `/v1/usage?start=${encodeURIComponent(start)}`);
  balance.textContent = `${usage.credits_balance.toFixed(4)} credits`;
  const days = usage.by_day;
  plot(usagePlot, {
    title: "Credits per day", labels: ["compute", "storage"], bars: true,
    x: days.map((d) => Date.parse(`${d.date}T00:00:00Z`) / 1000),
    ys: [days.map((d) => d.compute_credits), days.map((d) => d.storage_credits)],
  });

  async function refresh() {
    const list = await api("GET", "/v1/deployments");
    replace(rows, list.data.map((d) => h("tr", {},
      h("td", {}, d.model), h("td", {}, d.pipeline),
      h("td", {}, badge(d.state), d.state_reason ? h("div", { class: "error" }, d.state_reason) : null),
      h("td", {}, d.readiness), h("td", {}, `${d.replicas} (${d.min_replicas}–${d.max_replicas})`),
      h("td", {}, d.memory_gb.toFixed(3)))));
    if (!list.data.length) replace(rows, h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No deployments yet.")));
  }
  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), 3000);
  return () => clearInterval(timer);
}
