// The public API, with the key from sessionStorage (never the URL); or, for a person signed in through the
// organization's identity provider, with the session's cookie (HttpOnly: this script never reads it) and
// its CSRF token, held in memory only.

const ACCOUNT = "modelhost.accountKey";
const ADMIN = "modelhost.adminKey";

export const session = {
  get key() { return sessionStorage.getItem(ACCOUNT); },
  set key(value) { value ? sessionStorage.setItem(ACCOUNT, value) : sessionStorage.removeItem(ACCOUNT); },
  get adminKey() { return sessionStorage.getItem(ADMIN); },
  set adminKey(value) { value ? sessionStorage.setItem(ADMIN, value) : sessionStorage.removeItem(ADMIN); },
};

// GET /v1/auth/session's answer while a person is signed in (null otherwise); `available`: the server
// offers single sign-on (GET /v1/auth/config)
export const sso = { session: null, available: false };

// Whether a request goes with the sign-in session rather than a key (a key given in this tab wins)
function withSession(admin) {
  return Boolean(sso.session) && !(admin ? session.adminKey : session.key);
}

export async function loadSession() {
  const config = await fetch("/v1/auth/config", { credentials: "omit" });
  sso.available = config.ok && (await config.json()).sso === true;
  if (!sso.available) return;
  const answer = await fetch("/v1/auth/session", { credentials: "same-origin" });
  sso.session = answer.ok ? await answer.json() : null;
}

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

export function authHeaders(admin = false) {
  if (withSession(admin)) return { "x-csrf-token": sso.session.csrf_token };
  const key = admin ? session.adminKey : session.key;
  return key ? { Authorization: `Bearer ${key}` } : {};
}

export async function request(method, path, { body, admin = false, headers = {}, signal, signingIn = false } = {}) {
  const init = { method, headers: { ...authHeaders(admin), ...headers }, signal, credentials: withSession(admin) ? "same-origin" : "omit" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401 && !admin && !signingIn && session.key && init.headers.Authorization === `Bearer ${session.key}`) {
    session.key = null;
    window.dispatchEvent(new Event("modelhost:unauthorized"));
  } else if (response.status === 401 && init.credentials === "same-origin") {
    sso.session = null; // the session ended (signed out elsewhere, idle, disabled)
    window.dispatchEvent(new Event("modelhost:unauthorized"));
  }
  if (!response.ok) throw new ApiError(response.status, await readJson(response));
  return response;
}

export async function api(method, path, options) {
  return readJson(await request(method, path, options));
}

async function readJson(response) {
  const text = await response.text();
  try { return text ? JSON.parse(text) : null; } catch { return text; }
}

let openapi = null;
export async function openApi() {
  openapi = openapi || (await api("GET", "/openapi.json"));
  return openapi;
}

// Follow `$ref`s and unwrap `anyOf: [X, null]` in the OpenAPI document.
export function resolve(schema, doc) {
  let s = schema || {};
  for (let i = 0; i < 20; i++) {
    if (s.$ref) s = s.$ref.split("/").slice(1).reduce((o, k) => o[k], doc);
    else if (s.anyOf || s.oneOf) {
      const options = (s.anyOf || s.oneOf).filter((o) => o.type !== "null");
      if (options.length !== 1) return { ...s, description: s.description };
      s = { ...options[0], description: s.description || options[0].description, default: s.default };
    } else return s;
  }
  return s;
}
