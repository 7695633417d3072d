// Overview: your quota and what you used of it (a person's key or session), balance, credits per day
// (compute vs storage), deployments with their live state.
import { api } from "../api.js";
import { badge, h, replace } from "../dom.js";
import { plot } from "../plot.js";

export async function render(main) {
  const balance = h("div", { class: "big", id: "balance" }, "…");
  const usagePlot = h("div", { id: "usage-plot" });
  const rows = h("tbody");
  const quota = h("div", { id: "my-quota" });
  replace(main,
    h("h2", {}, "Overview"),
    h("section", { class: "card" }, h("h3", {}, "Your quota"), quota),
    h("section", { class: "card" }, h("h3", {}, "Credit balance"), balance, h("h3", {}, "Credits per day (last 30 days)"), usagePlot),
    h("section", { class: "card" }, h("h3", {}, "Deployments"),
      h("table", { id: "overview-deployments" }, h("thead", {}, h("tr", {}, ["Model", "Task", "State", "Readiness", "Replicas", "Memory (GB)"].map((t) => h("th", {}, t)))), rows)));

  showQuota(quota, (await api("GET", "/v1/me")).quota);
  const today = Math.floor(Date.now() / 86400e3) * 86400;
  const first = today - 29 * 86400;
  const usage = await api("GET", `/v1/usage?start=${first}`);
  balance.textContent = `${usage.credits_balance.toFixed(4)} credits`;
  // every day of the range, days without usage at 0
  const byDay = new Map(usage.by_day.map((d) => [Date.parse(`${d.date}T00:00:00Z`) / 1000, d]));
  const x = Array.from({ length: 30 }, (_, i) => first + i * 86400);
  usagePlot.dataset.days = String(usage.by_day.length);
  plot(usagePlot, {
    title: "Credits per day", labels: ["compute", "storage"], bars: true, width: 900, height: 260,
    x, ys: [x.map((t) => (byDay.get(t) || {}).compute_credits || 0), x.map((t) => (byDay.get(t) || {}).storage_credits || 0)],
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

// `GET /v1/me`'s quota: the limits that apply to you and what you used of them this UTC day and month
function showQuota(el, quota) {
  if (!quota) { replace(el, h("p", { class: "muted" }, "A service key: no person, no quota.")); return; }
  const source = { person: "your own", role: "your role's default" }[quota.source] || "none (unlimited)";
  const used = (use, what) => {
    const left = use[`${what}_remaining`];
    return left == null ? `${use[what]} ${what}` : `${use[what]} of ${use[what] + left} ${what} (${left} left)`;
  };
  replace(el, h("p", {}, `Quota: ${source}.`),
    ...[["day", "Today"], ["month", "This month"]].map(([period, label]) => {
      const use = quota[period];
      return h("p", { dataset: { period } }, `${label} (${use.period}, UTC): ${used(use, "requests")}, ${used(use, "tokens")}.`);
    }));
}
