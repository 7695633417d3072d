// People (admins): the account's members and their roles; add a person without sign-in by email, or,
// where the server offers single sign-on, invite an email (a member once they sign in and accept);
// change a role, disable or enable, sign out everywhere, remove. Their keys and sessions follow at once
// (docs/access.md). And the account's allow-list of MCP servers that hosted MCP tools may reach
// (docs/responses.md, "MCP tools").
import { api, sso } from "../api.js";
import { confirmButton, field, h, message, replace, when } from "../dom.js";

const ROLES = ["owner", "admin", "developer", "viewer", "billing"];

export async function render(main) {
  const email = h("input", { type: "email", id: "user-email", placeholder: "someone@example.com", required: true });
  const role = h("select", { id: "user-role" }, ROLES.map((r) => h("option", { value: r, selected: r === "developer" }, r)));
  const status = h("p", { id: "user-status" });
  const inviting = sso.available;
  const form = h("form", { class: "row", id: "user-form" }, field("Email", email), field("Role", role), h("button", { type: "submit" }, inviting ? "Invite" : "Add"));
  const rows = h("tbody");
  const invited = h("tbody");
  replace(main, h("h2", {}, "People"),
    h("section", { class: "card" }, h("h3", {}, inviting ? "Invite a person" : "Add a person"),
      h("p", { class: "muted" }, inviting
        ? "Offered to whoever signs in through your identity provider with this email (verified there); a member once they accept."
        : "A person without sign-in: they use keys an admin makes for them."), form, status),
    inviting ? h("section", { class: "card" }, h("h3", {}, "Invitations"),
      h("table", { id: "invitation-table" }, h("thead", {}, h("tr", {}, ["Email", "Role", "Expires", ""].map((t) => h("th", {}, t)))), invited)) : null,
    h("section", { class: "card" }, h("h3", {}, "Members"),
      h("table", { id: "user-list" }, h("thead", {}, h("tr", {}, ["Email", "Name", "Role", "State", "Signs in", "Member since", ""].map((t) => h("th", {}, t)))), rows)),
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
      h("td", {},
        h("button", { type: "button", class: "secondary user-toggle", onclick: () => change(u, { disabled: !u.disabled }) }, u.disabled ? "Enable" : "Disable"),
        confirmButton("Sign out everywhere", async () => {
          const done = await act("POST", `/v1/users/${u.id}/sign-out-everywhere`);
          if (done) message(status, `${done.sessions_ended} sessions ended, ${done.keys_revoked} keys revoked.`, "ok");
        }, "secondary user-sign-out"),
        confirmButton("Remove", () => act("DELETE", `/v1/users/${u.id}`))))));
  }
  await refresh();
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
