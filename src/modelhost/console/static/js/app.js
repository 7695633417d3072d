// The console's shell: sign-in, navigation by the URL's hash, one page at a time.
import { api, loadSession, session, sso } from "./api.js";
import { field, h, message, replace } from "./dom.js";
import * as artifacts from "./pages/artifacts.js";
import * as audit from "./pages/audit.js";
import * as batches from "./pages/batches.js";
import * as deployments from "./pages/deployments.js";
import * as evals from "./pages/evals.js";
import * as finetuning from "./pages/finetuning.js";
import * as keys from "./pages/keys.js";
import * as operator from "./pages/operator.js";
import * as overview from "./pages/overview.js";
import * as playground from "./pages/playground.js";
import * as users from "./pages/users.js";

const PAGES = { overview, deployments, artifacts, batches, evals, finetuning, keys, users, audit, playground, operator };
const TITLES = { overview: "Overview", deployments: "Deployments", artifacts: "Artifacts", batches: "Batches", evals: "Evals", finetuning: "Fine-tuning", keys: "Keys", users: "People", audit: "Audit", playground: "Playground", operator: "Operator" };
let cleanup = null;
let shown = 0; // which show() is the latest: an older page still loading is stopped when it resolves

function current() {
  const name = location.hash.replace(/^#\/?/, "").split("/")[0];
  return PAGES[name] ? name : "overview";
}

function nav() {
  const page = current();
  replace(document.getElementById("nav"), Object.keys(PAGES).map((name) =>
    h("a", { href: `#${name}`, class: name === page ? "active" : "", id: `nav-${name}`, onclick: () => { if (current() === name) show(); } }, TITLES[name])));
  const who = document.getElementById("who");
  if (sso.session && !session.key) {
    const s = sso.session;
    const accounts = s.accounts.length > 1 ? h("select", { id: "account-switch", onchange: async (event) => {
      try { sso.session = await api("POST", "/v1/auth/session/account", { body: { id: event.target.value } }); } catch { /* shown by the page */ }
      show();
    } }, s.accounts.map((a) => h("option", { value: a.id, selected: a.id === s.account_id }, `${a.id} (${a.role})`))) : null;
    replace(who, h("span", { class: "muted", id: "signed-in-as" }, `${s.email}${s.role ? ` · ${s.role}` : s.operator ? " · operator" : ""}`), accounts,
      h("button", { type: "button", class: "secondary", id: "sign-out", onclick: signOut }, "Sign out"));
  } else if (session.key || session.adminKey) {
    replace(who, h("span", { class: "muted" }, session.key ? "signed in" : "operator"),
      h("button", { type: "button", class: "secondary", id: "sign-out", onclick: () => { session.key = null; session.adminKey = null; show(); } }, "Sign out"));
  } else replace(who);
  invitations();
}

// Invitations offered to the signed-in person (their email, verified by the identity provider): a
// member of that account only once they accept (docs/access.md, "Invitations").
function invitations() {
  const offered = sso.session && !session.key ? sso.session.invitations : [];
  const box = document.getElementById("invitations");
  if (!offered.length) { replace(box); return; }
  const status = h("p", { id: "invitation-status" });
  async function answer(invitation, verb) {
    try {
      const path = `/v1/auth/invitations/${encodeURIComponent(invitation.id)}/${verb}`;
      const after = await api("POST", path);
      sso.session = verb === "accept" ? after : await api("GET", "/v1/auth/session");
      show();
    } catch (error) { message(status, error.message); }
  }
  replace(box, h("section", { class: "card" }, h("h3", {}, "Invitations"),
    h("ul", { id: "invitation-list" }, offered.map((i) => h("li", { dataset: { id: i.id } },
      `Account ${i.account_id}, as ${i.role} `,
      h("button", { type: "button", class: "invitation-accept", onclick: () => answer(i, "accept") }, "Accept"),
      h("button", { type: "button", class: "secondary invitation-decline", onclick: () => answer(i, "decline") }, "Decline")))),
    status));
}

async function signOut() {
  let ended = null;
  try { ended = await api("POST", "/v1/auth/logout"); } catch { /* already ended */ }
  sso.session = null;
  if (ended && ended.logout_url) location.assign(ended.logout_url); // and out of the identity provider too
  else show();
}

function organizationSignIn() {
  const hint = h("input", { type: "text", id: "sso-login-hint", placeholder: "you@example.com", autocomplete: "username" });
  const form = h("form", { class: "row", id: "sso-sign-in" }, field("Email or username (optional)", hint),
    h("button", { type: "submit", id: "sso-sign-in-button" }, "Sign in with your organization"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams({ return_to: `/console${location.hash}` });
    if (hint.value.trim()) query.set("login_hint", hint.value.trim());
    location.assign(`/v1/auth/login?${query}`);
  });
  return h("section", { class: "card" }, h("h2", {}, "Single sign-on"),
    h("p", { class: "muted" }, "Sign in through your organization's identity provider; the session is kept by this server."), form);
}

function signIn(main) {
  const key = h("input", { type: "password", id: "sign-in-key", placeholder: "mh-...", size: 48, autocomplete: "off" });
  const status = h("p", { id: "sign-in-status" });
  const form = h("form", { class: "row", id: "sign-in" }, field("Account key", key), h("button", { type: "submit" }, "Sign in"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    session.key = key.value.trim();
    try {
      await api("GET", "/v1/usage", { signingIn: true });
      show();
    } catch (error) {
      session.key = null;
      message(status, `Sign-in failed: ${error.message}`);
    }
  });
  replace(main, sso.available ? organizationSignIn() : null, h("section", { class: "card" }, h("h2", {}, sso.available ? "Or sign in with an account key" : "Sign in"),
    h("p", { class: "muted" }, "Your account key stays in this tab (sessionStorage) and is sent only as an Authorization header to this server."),
    form, status));
}

async function show() {
  const mine = ++shown;
  if (cleanup) { cleanup(); cleanup = null; }
  nav();
  const main = document.getElementById("main");
  const page = current();
  main.dataset.page = page;
  main.dataset.ready = "no";
  if (!session.key && !sso.session && page !== "operator") {
    signIn(main);
    main.dataset.ready = "sign-in";
    return;
  }
  replace(main);
  if (sso.session && !session.key && !sso.session.account_id && !sso.session.operator && page !== "operator") {
    replace(main, h("p", { class: "muted", id: "no-account" }, "You are a member of no account yet: accept an invitation above, or ask for one."));
    main.dataset.ready = "yes";
    return;
  }
  let stop = null;
  try {
    stop = (await PAGES[page].render(main)) || null;
  } catch (error) {
    if (mine === shown) replace(main, h("p", { class: "error" }, `Could not load ${TITLES[page]}: ${error.message}`));
  }
  if (mine !== shown) {
    if (stop) stop();
    return;
  }
  cleanup = stop;
  main.dataset.ready = "yes";
}

window.addEventListener("hashchange", show);
window.addEventListener("modelhost:session", nav);
// the account key stopped working (revoked): back to the sign-in form, saying why
window.addEventListener("modelhost:unauthorized", () => {
  show();
  const status = document.getElementById("sign-in-status");
  if (status) message(status, "Your key was refused (revoked or unknown), or your session ended: sign in again.");
});
loadSession().catch(() => {}).finally(show);
