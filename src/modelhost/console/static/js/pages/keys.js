// Keys: create (account or scoped to deployments, with rate limits and an expiry), the secret shown once,
// list with limits, what is left of them, its weight (its share of a shared model) and when each expires,
// revoke.
import { api } from "../api.js";
import { confirmButton, field, h, message, replace, when } from "../dom.js";

export async function render(main) {
  const name = h("input", { type: "text", id: "key-name", placeholder: "ci" });
  const scoped = h("input", { type: "checkbox", id: "key-scoped" });
  const boxes = h("div", { id: "key-deployments", class: "row" });
  const status = h("div", { id: "key-created" });
  const expiresIn = h("input", { type: "number", min: "1", step: "1", id: "key-expires-in", placeholder: "never" });
  const weight = h("input", { type: "number", min: "0.01", max: "1000", step: "any", id: "key-weight", placeholder: "1" });
  const limitInputs = LIMITS.map(([key, label]) => [key, h("input", { type: "number", min: "1", step: "1", id: `key-${key}`, placeholder: "unlimited" }), label]);
  const form = h("form", { id: "key-form" },
    h("div", { class: "row" }, field("Name", name), h("label", {}, scoped, " only for these deployments:"), boxes),
    h("div", { class: "row" }, limitInputs.map(([, input, label]) => field(label, input)), field("Expires in (s)", expiresIn), field("Weight", weight)),
    h("p", {}, h("button", { type: "submit" }, "Create key")));
  const rows = h("tbody");
  replace(main, h("h2", {}, "Keys"), h("section", { class: "card" }, h("h3", {}, "New key"), form, status),
    h("section", { class: "card" }, h("h3", {}, "Keys"),
      h("table", { id: "key-list" }, h("thead", {}, h("tr", {}, ["Name", "Kind", "Deployments", "Prefix", "Limits", "Left now", "Weight", "Created", "Expires", "Revoked", ""].map((t) => h("th", {}, t)))), rows)));

  const deployments = (await api("GET", "/v1/deployments")).data;
  const models = new Map(deployments.map((d) => [d.id, d.model]));
  replace(boxes, deployments.map((d) => h("label", {}, h("input", { type: "checkbox", value: d.id, class: "key-deployment", dataset: { model: d.model } }), ` ${d.model}`)));
  if (!deployments.length) replace(boxes, h("span", { class: "muted" }, "(no deployments)"));

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const chosen = [...boxes.querySelectorAll("input:checked")].map((i) => i.value);
    const body = { name: name.value.trim() || null };
    const limits = Object.fromEntries(limitInputs.filter(([, input]) => input.value).map(([key, input]) => [key, Number(input.value)]));
    if (Object.keys(limits).length) body.limits = limits;
    if (expiresIn.value) body.expires_in = Number(expiresIn.value);
    if (weight.value) body.weight = Number(weight.value);
    if (scoped.checked) {
      if (!chosen.length) return message(status, "Choose at least one deployment for a scoped key.");
      body.deployments = chosen;
    }
    try {
      const key = await api("POST", "/v1/keys", { body });
      const secret = h("div", { class: "secret", id: "key-secret" }, key.api_key);
      const copied = h("span");
      replace(status, h("p", {}, "The secret is shown only this once:"), secret,
        h("p", {}, h("button", { type: "button", class: "secondary", id: "key-copy", onclick: async () => {
          try { await navigator.clipboard.writeText(key.api_key); message(copied, " copied", "ok"); }
          catch { getSelection().selectAllChildren(secret); message(copied, " selected: press Ctrl+C", "muted"); }
        } }, "Copy"), copied));
      await refresh();
    } catch (error) { message(status, error.message); }
  });

  async function refresh() {
    const keys = (await api("GET", "/v1/keys")).data;
    replace(rows, keys.map((k) => h("tr", { dataset: { id: k.id, revoked: k.revoked_at ? "yes" : "no" } },
      h("td", {}, k.name || ""), h("td", {}, k.kind),
      h("td", {}, (k.deployments || []).map((id) => models.get(id) || id).join(", ")),
      h("td", {}, h("code", {}, k.prefix)), h("td", { class: "limits" }, describe(k.limits)), h("td", { class: "use" }, left(k.use)),
      h("td", { class: "weight" }, String(k.weight)), h("td", {}, when(k.created_at)), h("td", { class: "expires" }, when(k.expires_at)), h("td", { class: "revoked" }, when(k.revoked_at)),
      h("td", {}, k.revoked_at ? null : confirmButton("Revoke", async () => {
        try { await api("DELETE", `/v1/keys/${k.id}`); } catch (error) { message(status, error.message); }
        await refresh();
      })))));
  }
  await refresh();
}

// The limits a key can be given here (the account's own are the operator's), as the API names them
const LIMITS = [["requests_per_minute", "Requests / min"], ["tokens_per_minute", "Tokens / min"], ["concurrent_requests", "At once"]];

function describe(limits) {
  if (!limits) return "unlimited";
  return LIMITS.filter(([key]) => limits[key] != null).map(([key, label]) => `${label}: ${limits[key]}`).join(", ") || "unlimited";
}

function left(use) {
  if (!use) return "";
  const parts = [];
  if (use.requests_remaining != null) parts.push(`${use.requests_remaining} requests`);
  if (use.tokens_remaining != null) parts.push(`${use.tokens_remaining} tokens`);
  parts.push(`${use.in_flight} in flight`);
  return parts.join(", ");
}
