// The public API, with the key from sessionStorage (never a cookie, never the URL).

const ACCOUNT = "modelhost.accountKey";
const ADMIN = "modelhost.adminKey";

export const session = {
  get key() { return sessionStorage.getItem(ACCOUNT); },
  set key(value) { value ? sessionStorage.setItem(ACCOUNT, value) : sessionStorage.removeItem(ACCOUNT); },
  get adminKey() { return sessionStorage.getItem(ADMIN); },
  set adminKey(value) { value ? sessionStorage.setItem(ADMIN, value) : sessionStorage.removeItem(ADMIN); },
};

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

export function authHeaders(admin = false) {
  const key = admin ? session.adminKey : session.key;
  return key ? { Authorization: `Bearer ${key}` } : {};
}

export async function request(method, path, { body, admin = false, headers = {}, signal, signingIn = false } = {}) {
  const init = { method, headers: { ...authHeaders(admin), ...headers }, signal, credentials: "omit" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401 && !admin && !signingIn && session.key && init.headers.Authorization === `Bearer ${session.key}`) {
    session.key = null;
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
