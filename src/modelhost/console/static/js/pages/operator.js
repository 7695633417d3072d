// Operator view (admin key): accounts, their credit top-ups and weights; the server's memory capacity
// (reserved against the budget over time, every deployment holding memory, each GPU), polled every 2 s.
import { api, session, sso } from "../api.js";
import { badge, field, h, message, replace, when } from "../dom.js";
import { plot } from "../plot.js";

const MIB = 1024 * 1024;
const KEEP_SECONDS = 300; // the plot shows the last five minutes

function mib(bytes) {
  return (bytes / MIB).toFixed(1);
}

// Reserved memory and the budget (MiB) at each poll, the last KEEP_SECONDS of them.
class CapacityHistory {
  constructor() { this.t = []; this.reserved = []; this.budget = []; }

  add(memory, now = Date.now() / 1000) {
    this.t.push(now);
    this.reserved.push(memory.reserved_bytes / MIB);
    this.budget.push(memory.budget_bytes / MIB);
    while (this.t.length && this.t[0] < now - KEEP_SECONDS) for (const series of [this.t, this.reserved, this.budget]) series.shift();
  }
}

function summary(memory) {
  const parts = [`Reserved ${mib(memory.reserved_bytes)} MiB of a ${mib(memory.budget_bytes)} MiB budget, ${mib(memory.free_bytes)} MiB free`];
  if (memory.limit_bytes != null) parts.push(`machine or cgroup limit ${mib(memory.limit_bytes)} MiB`);
  if (memory.server_bytes != null) parts.push(`the server itself ${mib(memory.server_bytes)} MiB`);
  parts.push(`${memory.waiting} load${memory.waiting === 1 ? "" : "s"} waiting for memory`);
  return parts.join("; ") + ".";
}

function footprint(d) {
  const gpu = d.gpu_footprint_bytes ? ` + ${mib(d.gpu_footprint_bytes)} MiB GPU` : "";
  return `${mib(d.footprint_bytes)} MiB${gpu} (${d.footprint_measured ? "measured" : "predicted"})`;
}

function holderRow(d, names) {
  return h("tr", { dataset: { id: d.id, state: d.state, measured: d.footprint_measured ? "yes" : "no" } },
    h("td", { class: "model" }, d.model), h("td", { class: "account" }, names.get(d.account_id) || "", " ", h("code", {}, d.account_id)),
    h("td", { class: "readiness" }, d.readiness), h("td", { class: "state" }, badge(d.state)), h("td", { class: "device" }, d.device),
    h("td", { class: "footprint" }, footprint(d)), h("td", { class: "in-flight" }, String(d.in_flight)),
    h("td", { class: "last-used" }, when(d.last_used_at)));
}

function capacityCard() {
  const status = h("p", { id: "capacity-summary" });
  const chart = h("div", { id: "capacity-plot" });
  const gpus = h("div", { id: "capacity-gpus" });
  const rows = h("tbody");
  const el = h("section", { class: "card", id: "capacity" }, h("h3", {}, "Capacity"), status, chart, gpus,
    h("h3", {}, "Deployments holding memory"),
    h("table", { id: "capacity-deployments" }, h("thead", {}, h("tr", {},
      ["Model", "Account", "Readiness", "State", "Device", "Footprint", "In flight", "Last used"].map((t) => h("th", {}, t)))), rows));
  const history = new CapacityHistory();

  function show(capacity, names) {
    history.add(capacity.memory);
    status.textContent = summary(capacity.memory);
    plot(chart, { title: "Host memory (MiB)", labels: ["reserved", "budget"], x: history.t, ys: [history.reserved, history.budget], width: 900, height: 240 });
    replace(gpus, capacity.gpus.map((g) => h("p", { class: "gpu", dataset: { index: g.index } },
      `GPU ${g.index}: ${mib(g.reserved_bytes)} / ${mib(g.budget_bytes)} MiB`)));
    replace(rows, capacity.deployments.map((d) => holderRow(d, names)));
    if (!capacity.deployments.length) replace(rows, h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No deployment holds memory.")));
  }
  return { el, show, fail: (error) => message(status, `Capacity: ${error.message}`) };
}

export async function render(main) {
  const status = h("div", { id: "operator-status" });
  const adminKey = h("input", { type: "password", id: "admin-key", placeholder: "mh-admin-...", size: 40, autocomplete: "off" });
  const keyForm = h("form", { class: "row", id: "admin-form" }, field("Admin key", adminKey), h("button", { type: "submit" }, "Use admin key"));
  const name = h("input", { type: "text", id: "account-name" });
  const credits = h("input", { type: "number", id: "account-credits", value: "100", step: "any" });
  const create = h("form", { class: "row", id: "account-form" }, field("Account name", name), field("Credits", credits), h("button", { type: "submit" }, "Create account"));
  const rows = h("tbody");
  const body = h("div");
  const names = new Map(); // account ID -> name, for the capacity table
  let capacity = null; // the capacity card shown, while the admin key is accepted
  let timer = null;
  let loads = 0; // which load() is the latest: only it starts polling, and none once the page is left
  replace(main, h("h2", {}, "Operator"), h("section", { class: "card" }, keyForm, status), body);

  keyForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    session.adminKey = adminKey.value.trim();
    window.dispatchEvent(new Event("modelhost:session"));
    await load();
  });
  create.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const account = await api("POST", "/v1/admin/accounts", { admin: true, body: { name: name.value.trim(), credits: Number(credits.value) } });
      replace(status, h("p", {}, `Account ${account.name} created. Its account key, shown once:`), h("div", { class: "secret", id: "account-key" }, account.api_key),
        h("button", { type: "button", class: "secondary", onclick: () => { session.key = account.api_key; location.hash = "#overview"; } }, "Sign in as this account"));
      await refresh();
    } catch (error) { message(status, error.message); }
  });

  async function refresh() {
    const accounts = (await api("GET", "/v1/admin/accounts", { admin: true })).data;
    for (const a of accounts) names.set(a.id, a.name);
    replace(rows, accounts.map((a) => {
      const amount = h("input", { type: "number", value: "10", step: "any", class: "account-top-up" });
      const weight = h("input", { type: "number", value: String(a.weight), min: "0.01", max: "1000", step: "any", class: "account-weight" });
      const note = h("span");
      return h("tr", { dataset: { id: a.id } }, h("td", {}, a.name), h("td", {}, h("code", {}, a.id)),
        h("td", {}, a.credits.toFixed(4)), h("td", {}, a.credits_used.toFixed(4)),
        h("td", {}, weight, " ", h("button", { type: "button", class: "secondary", onclick: async () => {
          try { await api("PATCH", `/v1/admin/accounts/${a.id}`, { admin: true, body: { weight: Number(weight.value) } }); await refresh(); }
          catch (error) { message(note, error.message); }
        } }, "Set")),
        h("td", {}, when(a.created_at)),
        h("td", {}, amount, " ", h("button", { type: "button", class: "secondary", onclick: async () => {
          try { await api("POST", `/v1/admin/accounts/${a.id}/credits`, { admin: true, body: { credits: Number(amount.value) } }); await refresh(); }
          catch (error) { message(note, error.message); }
        } }, "Add credits"), note));
    }));
  }

  async function poll() {
    const shown = capacity;
    if (!shown) return;
    try {
      const answer = await api("GET", "/v1/admin/capacity", { admin: true });
      if (shown === capacity) shown.show(answer, names);
    } catch (error) { if (shown === capacity) shown.fail(error); }
  }

  async function load() {
    const mine = ++loads;
    clearInterval(timer);
    if (!session.adminKey && !(sso.session && sso.session.operator)) return replace(body, h("p", { class: "muted" }, "Enter the operator's admin key to manage accounts."));
    capacity = capacityCard();
    try {
      replace(body, h("section", { class: "card" }, h("h3", {}, "New account"), create),
        h("section", { class: "card" }, h("h3", {}, "Accounts"),
          h("table", { id: "account-list" }, h("thead", {}, h("tr", {}, ["Name", "ID", "Balance", "Used", "Weight", "Created", "Top-up"].map((t) => h("th", {}, t)))), rows)),
        capacity.el);
      await refresh();
    } catch (error) {
      session.adminKey = null;
      capacity = null;
      return replace(body, h("p", { class: "error" }, `Admin key refused: ${error.message}`));
    }
    await poll();
    if (mine === loads) timer = setInterval(poll, 2000);
  }
  await load();
  return () => { loads++; clearInterval(timer); }; // the page is left: no load under way starts polling
}
