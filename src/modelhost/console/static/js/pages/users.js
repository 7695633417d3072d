// People (admins): the account's members and their roles; add a person without sign-in by email, or,
// where the server offers single sign-on, invite an email (a member once they sign in and accept);
// change a role, disable or enable, sign out everywhere, remove. Their keys and sessions follow at once
// (docs/access.md). Quotas per person: a person's own, or their role's default (docs/limits.md, "Quotas
// per person"). Role weights: each role's share of a shared model inside the account (docs/limits.md, "Fair
// shares"). And the account's allow-list of MCP servers that hosted MCP tools may reach
// (docs/responses.md, "MCP tools").
import { api, sso } from "../api.js";
import { confirmButton, field, h, message, replace, when } from "../dom.js";

const ROLES = ["owner", "admin", "developer", "viewer", "billing"];
const QUOTA_FIELDS = ["requests_per_day", "requests_per_month", "tokens_per_day", "tokens_per_month"];

// A quota as text: the limits it sets ("" for none)
function quotaText(quota) {
  if (!quota) return "";
  return QUOTA_FIELDS.filter((f) => quota[f] != null).map((f) => `${quota[f]} ${f.replaceAll("_", " ")}`).join(", ");
}

export async function render(main) {
  const email = h("input", { type: "email", id: "user-email", placeholder: "someone@example.com", required: true });
  const role = h("select", { id: "user-role" }, ROLES.map((r) => h("option", { value: r, selected: r === "developer" }, r)));
  const status = h("p", { id: "user-status" });
  const inviting = sso.available;
  const form = h("form", { class: "row", id: "user-form" }, field("Email", email), field("Role", role), h("button", { type: "submit" }, inviting ? "Invite" : "Add"));
  const rows = h("tbody");
  const invited = h("tbody");
  const quotas = quotaEditor(() => refresh());
  replace(main, h("h2", {}, "People"),
    h("section", { class: "card" }, h("h3", {}, inviting ? "Invite a person" : "Add a person"),
      h("p", { class: "muted" }, inviting
        ? "Offered to whoever signs in through your identity provider with this email (verified there); a member once they accept."
        : "A person without sign-in: they use keys an admin makes for them."), form, status),
    inviting ? h("section", { class: "card" }, h("h3", {}, "Invitations"),
      h("table", { id: "invitation-table" }, h("thead", {}, h("tr", {}, ["Email", "Role", "Expires", ""].map((t) => h("th", {}, t)))), invited)) : null,
    h("section", { class: "card" }, h("h3", {}, "Members"),
      h("table", { id: "user-list" }, h("thead", {}, h("tr", {}, ["Email", "Name", "Role", "State", "Signs in", "Member since", "Quota", ""].map((t) => h("th", {}, t)))), rows)),
    quotas.card,
    roleWeights(),
    mcpServers());

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await api("POST", inviting ? "/v1/invitations" : "/v1/users", { body: { email: email.value.trim(), role: role.value } });
      email.value = "";
      message(status, inviting ? "Invited." : "Added.", "ok");
      await refresh();
    } catch (error) { message(status, error.message); }
  });

  async function act(method, path) {
    try { return await api(method, path); } catch (error) { message(status, error.message); return null; } finally { await refresh(); }
  }

  async function change(user, body) {
    try { await api("PATCH", `/v1/users/${user.id}`, { body }); } catch (error) { message(status, error.message); }
    await refresh();
  }

  async function refresh() {
    if (inviting) {
      const pending = (await api("GET", "/v1/invitations")).data;
      replace(invited, pending.map((i) => h("tr", { dataset: { id: i.id, email: i.email } },
        h("td", {}, i.email), h("td", {}, i.role), h("td", {}, when(i.expires_at)),
        h("td", {}, confirmButton("Withdraw", () => act("DELETE", `/v1/invitations/${i.id}`))))));
    }
    const users = (await api("GET", "/v1/users")).data;
    replace(rows, users.map((u) => h("tr", { dataset: { id: u.id, email: u.email } },
      h("td", {}, u.email), h("td", {}, u.name || ""),
      h("td", {}, h("select", { class: "user-role", onchange: (event) => change(u, { role: event.target.value }) },
        ROLES.map((r) => h("option", { value: r, selected: r === u.role }, r)))),
      h("td", { class: "state" }, u.disabled ? "disabled" : "active"),
      h("td", {}, u.signs_in ? "yes" : "no"),
      h("td", {}, when(u.created_at)),
      h("td", { class: "quota" }, quotaText(u.quota) || "role's"),
      h("td", {},
        h("button", { type: "button", class: "secondary user-toggle", onclick: () => change(u, { disabled: !u.disabled }) }, u.disabled ? "Enable" : "Disable"),
        confirmButton("Sign out everywhere", async () => {
          const done = await act("POST", `/v1/users/${u.id}/sign-out-everywhere`);
          if (done) message(status, `${done.sessions_ended} sessions ended, ${done.keys_revoked} keys revoked.`, "ok");
        }, "secondary user-sign-out"),
        confirmButton("Remove", () => act("DELETE", `/v1/users/${u.id}`))))));
    await quotas.show(users);
  }
  await refresh();
}

// Quotas: each role's default and a person's own (which replaces their role's), set one at a time; a
// quota saved with no limit is removed.
function quotaEditor(changed) {
  const target = h("select", { id: "quota-target" });
  const inputs = Object.fromEntries(QUOTA_FIELDS.map((f) => [f, h("input", { type: "number", min: 1, id: `quota-${f}`, placeholder: "unlimited" })]));
  const status = h("p", { id: "quota-status" });
  const roleRows = h("tbody");
  const form = h("form", { class: "row", id: "quota-form" }, field("For", target),
    ...QUOTA_FIELDS.map((f) => field(f.replaceAll("_", " "), inputs[f])), h("button", { type: "submit" }, "Save"));
  let members = [];
  let roles = {};
  const current = () => {
    const [kind, id] = target.value.split(":");
    return kind === "role" ? roles[id] : (members.find((u) => u.id === id) || {}).quota;
  };
  const fill = () => { const quota = current() || {}; for (const f of QUOTA_FIELDS) inputs[f].value = quota[f] ?? ""; };
  target.addEventListener("change", fill);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const limits = Object.fromEntries(QUOTA_FIELDS.map((f) => [f, inputs[f].value ? Number(inputs[f].value) : null]));
    const quota = Object.values(limits).some((v) => v !== null) ? limits : null;
    const [kind, id] = target.value.split(":");
    try {
      if (kind === "role") await api("PATCH", "/v1/role-quotas", { body: { [id]: quota } });
      else await api("PATCH", `/v1/users/${id}`, { body: { quota } });
      message(status, quota ? "Saved." : "Removed.", "ok");
      await changed();
    } catch (error) { message(status, error.message); }
  });
  async function show(users) {
    members = users;
    roles = await api("GET", "/v1/role-quotas");
    const chosen = target.value;
    replace(target, ...ROLES.map((r) => h("option", { value: `role:${r}` }, `every ${r} (default)`)),
      ...users.map((u) => h("option", { value: `user:${u.id}` }, u.email)));
    if (chosen) target.value = chosen;
    fill();
    replace(roleRows, ROLES.map((r) => h("tr", { dataset: { role: r } }, h("td", {}, r), h("td", { class: "quota" }, quotaText(roles[r]) || "none"))));
  }
  const card = h("section", { class: "card" }, h("h3", {}, "Quotas"),
    h("p", { class: "muted" }, "Requests and tokens per UTC day and month of a person, over every key they own and their sessions. A person's own quota replaces their role's default; past it, their requests are refused (429) until the day or month ends."),
    h("table", { id: "role-quota-list" }, h("thead", {}, h("tr", {}, ["Role", "Default quota"].map((t) => h("th", {}, t)))), roleRows),
    form, status);
  return { card, show };
}

// Each role's weight inside the account: a key's share of a shared model is its own weight times its
// person's role's; saved one role at a time (an empty weight: 1 again).
function roleWeights() {
  const role = h("select", { id: "role-weight-role" }, ROLES.map((r) => h("option", { value: r }, r)));
  const weight = h("input", { type: "number", min: 0.01, max: 1000, step: "any", id: "role-weight-value", placeholder: "1" });
  const status = h("p", { id: "role-weight-status" });
  const rows = h("tbody");
  const form = h("form", { class: "row", id: "role-weight-form" }, field("Role", role), field("Weight", weight), h("button", { type: "submit" }, "Save"));
  const show = (weights) => replace(rows, ROLES.map((r) => h("tr", { dataset: { role: r } }, h("td", {}, r), h("td", { class: "weight" }, String(weights[r])))));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      show(await api("PATCH", "/v1/role-weights", { body: { [role.value]: weight.value ? Number(weight.value) : null } }));
      message(status, "Saved.", "ok");
    } catch (error) { message(status, error.message); }
  });
  api("GET", "/v1/role-weights").then(show, (error) => message(status, error.message));
  return h("section", { class: "card" }, h("h3", {}, "Role weights"),
    h("p", { class: "muted" }, "Each role's share of a shared model inside the account: a key's share is its own weight times its person's role's; a sign-in session's is its role's. 1 by default."),
    h("table", { id: "role-weight-list" }, h("thead", {}, h("tr", {}, ["Role", "Weight"].map((t) => h("th", {}, t)))), rows),
    form, status);
}

// The MCP server URLs the account's hosted MCP tools may reach, one per line; saved whole (PUT).
function mcpServers() {
  const urls = h("textarea", { id: "mcp-urls", rows: 4, placeholder: "https://mcp.example.com/mcp" });
  const status = h("p", { id: "mcp-status" });
  const form = h("form", { id: "mcp-form" }, field("MCP server URLs, one per line", urls), h("button", { type: "submit" }, "Save"));
  const show = (answer) => { urls.value = answer.urls.join("\n"); };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const list = urls.value.split("\n").map((u) => u.trim()).filter(Boolean);
    try {
      show(await api("PUT", "/v1/mcp-servers", { body: { urls: list } }));
      message(status, "Saved.", "ok");
    } catch (error) { message(status, error.message); }
  });
  api("GET", "/v1/mcp-servers").then(show, (error) => message(status, error.message));
  return h("section", { class: "card" }, h("h3", {}, "MCP servers"),
    h("p", { class: "muted" }, "Hosted MCP tools (Responses and Messages APIs) reach only these servers: same scheme, host and port, the path at or below. None by default."),
    form, status);
}
