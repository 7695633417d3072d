// Audit: the account's audit log (who changed what: keys, deployments, artifacts, files, and the operator's
// changes to the account), newest first, filtered by action, a page at a time. Every value is text.
import { api } from "../api.js";
import { field, h, message, replace, when } from "../dom.js";

const PAGE = 50;

export async function render(main) {
  const action = h("input", { type: "text", id: "audit-action", placeholder: "key.created" });
  const status = h("p", { id: "audit-status" });
  const rows = h("tbody");
  const more = h("button", { type: "button", class: "secondary", id: "audit-more", hidden: true }, "Older");
  const form = h("form", { class: "row", id: "audit-form" }, field("Action", action), h("button", { type: "submit" }, "Show"));
  replace(main, h("h2", {}, "Audit log"),
    h("section", { class: "card" },
      h("p", { class: "muted" }, "Every change to this account's keys, deployments, artifacts and files, and the operator's changes to the account (credits, limits). Rows are chained by hash: the operator verifies the chain."),
      form, status,
      h("table", { id: "audit-list" }, h("thead", {}, h("tr", {}, ["When", "Action", "Target", "By", "Address", "Changes"].map((t) => h("th", {}, t)))), rows),
      h("p", {}, more)));

  let last = null;
  async function load(after) {
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (action.value.trim()) query.set("action", action.value.trim());
    if (after) query.set("after", after);
    try {
      const page = await api("GET", `/v1/audit?${query}`);
      const shown = page.data.map((row) => h("tr", { dataset: { id: row.id, action: row.action } },
        h("td", {}, when(row.created_at)), h("td", {}, h("code", {}, row.action)),
        h("td", {}, `${row.target.type} ${row.target.id}`),
        h("td", {}, [row.actor.kind, row.actor.key_id].filter(Boolean).join(" ")),
        h("td", {}, row.actor.address || ""),
        h("td", { class: "changes" }, describe(row.changes))));
      if (after) shown.forEach((tr) => rows.append(tr)); else replace(rows, shown);
      last = page.last_id;
      more.hidden = !page.has_more;
      message(status, page.data.length || after ? "" : "No changes recorded yet.", "muted");
    } catch (error) { message(status, error.message); }
  }
  form.addEventListener("submit", (event) => { event.preventDefault(); load(null); });
  more.addEventListener("click", () => load(last));
  await load(null);
}

function describe(changes) {
  return Object.entries(changes).map(([name, change]) => `${name}: ${show(change.before)} → ${show(change.after)}`).join("; ");
}

function show(value) {
  if (value === null || value === undefined) return "-";
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}
