// DOM helpers. Every piece of text goes in as a text node: nothing from the API or the user is ever
// parsed as HTML (no innerHTML anywhere in the console).

const PROPERTIES = new Set(["value", "checked", "disabled", "selected", "multiple", "webkitdirectory", "hidden"]);

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "innerHTML" || name === "outerHTML") throw new Error("no HTML strings in the console");
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (PROPERTIES.has(name)) el[name] = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export function field(label, input) {
  return h("label", { class: "field" }, label, input);
}

export function badge(state) {
  return h("span", { class: `badge state-${state}` }, state);
}

export function message(el, text, kind = "error") {
  replace(el, text ? h("span", { class: kind }, text) : null);
}

// A button that asks for a second click instead of a dialog.
export function confirmButton(label, action, cls = "danger") {
  let armed = false;
  const button = h("button", { type: "button", class: cls }, label);
  button.addEventListener("click", async () => {
    if (!armed) {
      armed = true;
      button.textContent = `Confirm ${label.toLowerCase()}`;
      setTimeout(() => { armed = false; button.textContent = label; }, 4000);
      return;
    }
    button.disabled = true;
    try { await action(); } finally { button.disabled = false; }
  });
  return button;
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}
