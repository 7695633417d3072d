// Operator view (admin key): accounts and credit top-ups.
import { api, session } from "../api.js";
import { field, h, message, replace, when } from "../dom.js";

export async function render(main) {
  const status = h("div", { id: "operator-status" });
  const adminKey = h("input", { type: "password", id: "admin-key", placeholder: "mh-admin-...", size: 40, autocomplete: "off" });
  const keyForm = h("form", { class: "row", id: "admin-form" }, field("Admin key", adminKey), h("button", { type: "submit" }, "Use admin key"));
  const name = h("input", { type: "text", id: "account-name" });
  const credits = h("input", { type: "number", id: "account-credits", value: "100", step: "any" });
  const create = h("form", { class: "row", id: "account-form" }, field("Account name", name), field("Credits", credits), h("button", { type: "submit" }, "Create account"));
  const rows = h("tbody");
  const body = h("div");
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
    replace(rows, accounts.map((a) => {
      const amount = h("input", { type: "number", value: "10", step: "any" });
      const note = h("span");
      return h("tr", { dataset: { id: a.id } }, h("td", {}, a.name), h("td", {}, h("code", {}, a.id)),
        h("td", {}, a.credits.toFixed(4)), h("td", {}, a.credits_used.toFixed(4)), h("td", {}, when(a.created_at)),
        h("td", {}, amount, " ", h("button", { type: "button", class: "secondary", onclick: async () => {
          try { await api("POST", `/v1/admin/accounts/${a.id}/credits`, { admin: true, body: { credits: Number(amount.value) } }); await refresh(); }
          catch (error) { message(note, error.message); }
        } }, "Add credits"), note));
    }));
  }

  async function load() {
    if (!session.adminKey) return replace(body, h("p", { class: "muted" }, "Enter the operator's admin key to manage accounts."));
    try {
      replace(body, h("section", { class: "card" }, h("h3", {}, "New account"), create),
        h("section", { class: "card" }, h("h3", {}, "Accounts"),
          h("table", { id: "account-list" }, h("thead", {}, h("tr", {}, ["Name", "ID", "Balance", "Used", "Created", "Top-up"].map((t) => h("th", {}, t)))), rows)));
      await refresh();
    } catch (error) {
      session.adminKey = null;
      replace(body, h("p", { class: "error" }, `Admin key refused: ${error.message}`));
    }
  }
  await load();
}
