// Playground: try a deployment by its task. Chat streams (SSE read from fetch's body), embeddings show
// a similarity matrix, every other task gets a form built from the OpenAPI document.
import { api, openApi, request, resolve } from "../api.js";
import { confirmButton, field, h, message, replace } from "../dom.js";

export async function render(main) {
  const deployments = (await api("GET", "/v1/deployments")).data;
  const chooser = h("select", { id: "playground-deployment" }, deployments.map((d) => h("option", { value: d.id }, `${d.model} (${d.pipeline}, ${d.state})`)));
  const area = h("div", { id: "playground" });
  replace(main, h("h2", {}, "Playground"), h("section", { class: "card" }, field("Deployment", chooser)), area);
  if (!deployments.length) return replace(area, h("p", { class: "muted" }, "Deploy a model first."));
  const wanted = new URLSearchParams(location.hash.split("?")[1] || "").get("deployment");
  if (wanted && deployments.some((d) => d.id === wanted)) chooser.value = wanted;
  let controller = null;
  const show = () => {
    if (controller) controller.abort();
    controller = new AbortController();
    const d = deployments.find((x) => x.id === chooser.value);
    const view = PLAYGROUNDS[d.pipeline] || generic;
    replace(area);
    view(area, d, controller.signal).catch((error) => area.append(h("p", { class: "error" }, error.message)));
  };
  chooser.addEventListener("change", show);
  show();
  return () => controller && controller.abort();
}

// ---------------------------------------------------------------- chat

async function* sse(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

async function chat(area, d, signal) {
  const history = [];
  const log = h("div", { class: "chat", id: "chat-log" });
  const input = h("textarea", { id: "chat-input", placeholder: "Say something…" });
  const maxTokens = h("input", { type: "number", id: "chat-max-tokens", value: "32", min: "1" });
  const temperature = h("input", { type: "number", id: "chat-temperature", value: "0.7", step: "0.1", min: "0", max: "2" });
  const tools = h("textarea", { id: "chat-tools", placeholder: "Tools (optional): a JSON array of OpenAI function tools" });
  const send = h("button", { type: "submit", id: "chat-send" }, "Send");
  const status = h("p");
  const vision = d.pipeline === "image-text-to-text";
  const picture = vision ? h("input", { type: "file", id: "chat-image", accept: "image/*" }) : null;
  const form = h("form", { id: "chat-form" }, input, h("div", { class: "row" }, field("max_tokens", maxTokens), field("temperature", temperature),
    vision ? field("Image (optional)", picture) : null, send), h("details", {}, h("summary", {}, "Tools"), tools), status);
  append(area, h("section", { class: "card" }, h("h3", {}, `Chat with ${d.model}`), log, form));

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) return;
    input.value = "";
    const image = picture && picture.files[0];
    if (image) {
      const uri = await new Promise((done, fail) => { const r = new FileReader(); r.onload = () => done(r.result); r.onerror = fail; r.readAsDataURL(image); });
      history.push({ role: "user", content: [{ type: "text", text }, { type: "image_url", image_url: { url: uri } }] });
      log.append(h("div", { class: "msg user" }, h("img", { src: URL.createObjectURL(image), alt: image.name, class: "answer-image" }), h("div", {}, text)));
      picture.value = "";
    } else {
      history.push({ role: "user", content: text });
      log.append(h("div", { class: "msg user" }, text));
    }
    const content = h("span", { class: "content" });
    const toolBox = h("div");
    const bubble = h("div", { class: "msg assistant", dataset: { chunks: "0", done: "no" } }, content, toolBox);
    log.append(bubble);
    send.disabled = true;
    replace(status);
    const body = { model: d.model, messages: history, stream: true, max_tokens: Number(maxTokens.value), temperature: Number(temperature.value) };
    if (tools.value.trim()) {
      try { body.tools = JSON.parse(tools.value); } catch { send.disabled = false; return message(status, "Tools must be a JSON array."); }
    }
    const calls = [];
    try {
      const response = await request("POST", "/v1/chat/completions", { body, signal });
      let chunks = 0;
      for await (const chunk of sse(response)) {
        const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
        if (delta.content) content.append(delta.content);
        for (const call of delta.tool_calls || []) {
          const c = (calls[call.index] = calls[call.index] || { id: call.id, name: "", arguments: "" });
          if (call.function && call.function.name) c.name += call.function.name;
          if (call.function && call.function.arguments) c.arguments += call.function.arguments;
        }
        if (calls.length) replace(toolBox, calls.map((c) => h("div", { class: "tool" }, `tool call ${c.name}(${c.arguments})`)));
        if (chunk.usage) status.textContent = `${chunk.usage.prompt_tokens} prompt + ${chunk.usage.completion_tokens} completion tokens`;
        bubble.dataset.chunks = String(++chunks);
      }
      history.push({ role: "assistant", content: content.textContent, ...(calls.length ? { tool_calls: calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } })) } : {}) });
    } catch (error) {
      message(status, error.message);
    } finally {
      bubble.dataset.done = "yes";
      send.disabled = false;
    }
  });
}

function append(el, ...children) { el.append(...children); }

// ---------------------------------------------------------------- agent runs (text-generation)

async function agents(area, d, signal) {
  const chooser = h("select", { id: "agent-choice" });
  const name = h("input", { type: "text", id: "agent-name", value: `${d.model}-agent` });
  const instructions = h("textarea", { id: "agent-instructions" }, "You are a helpful assistant.");
  const create = h("button", { type: "button", id: "agent-create", class: "secondary" }, "Create agent");
  const input = h("textarea", { id: "agent-input", placeholder: "The run's input" }, "Plan a day in Berlin.");
  const maxTokens = h("input", { type: "number", id: "agent-max-tokens", value: "24", min: "1" });
  const start = h("button", { type: "submit", id: "agent-run" }, "Start run");
  const status = h("p", { id: "agent-status" });
  const output = h("div", { class: "msg assistant", id: "agent-output" });
  const events = h("tbody", { id: "agent-events" });
  const runs = h("tbody", { id: "agent-runs" });
  const form = h("form", { id: "agent-form" }, h("div", { class: "row" }, field("Agent", chooser), field("New agent name", name), create),
    field("Instructions (for a new agent)", instructions), field("Input", input), h("div", { class: "row" }, field("max_tokens", maxTokens), start), status);
  area.append(h("section", { class: "card" }, h("h3", {}, `Agent runs on ${d.model}`), form, output,
    h("h3", {}, "Events"), h("table", {}, h("thead", {}, h("tr", {}, ["#", "Type", "Data"].map((t) => h("th", {}, t)))), events),
    h("h3", {}, "Runs"), h("table", {}, h("thead", {}, h("tr", {}, ["Run", "Status", "Output", ""].map((t) => h("th", {}, t)))), runs)));

  async function loadAgents(select) {
    const list = (await api("GET", "/v1/agent?limit=100", { signal })).data.filter((a) => a.model === d.model);
    replace(chooser, list.map((a) => h("option", { value: a.id }, `${a.name} (${a.id})`)));
    if (!list.length) replace(chooser, h("option", { value: "" }, "(none: create one)"));
    if (select) chooser.value = select;
    await loadRuns();
  }
  async function loadRuns() {
    if (!chooser.value) return replace(runs);
    const list = (await api("GET", `/v1/agent/${chooser.value}/runs?limit=20`, { signal })).data;
    replace(runs, list.map((r) => h("tr", { dataset: { id: r.id, status: r.status } }, h("td", {}, h("code", {}, r.id)), h("td", {}, r.status),
      h("td", {}, r.output || (r.error ? r.error.message : "")),
      h("td", {}, confirmButton("Delete", async () => {
        try { await api("DELETE", `/v1/agent/${r.agent_id}/runs/${r.id}`); } catch (error) { message(status, error.message); }
        await loadRuns();
      })))));
  }
  chooser.addEventListener("change", () => loadRuns().catch((e) => message(status, e.message)));
  create.addEventListener("click", async () => {
    try {
      const agent = await api("POST", "/v1/agent", { body: { name: name.value.trim(), model: d.model, instructions: instructions.value }, signal });
      await loadAgents(agent.id);
      message(status, `Agent ${agent.name} created.`, "ok");
    } catch (error) { message(status, error.message); }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!chooser.value) return message(status, "Create an agent first.");
    start.disabled = true;
    replace(events);
    replace(output);
    output.dataset.done = "no";
    try {
      const run = await api("POST", `/v1/agent/${chooser.value}/runs`, { body: { input: input.value, max_tokens: Number(maxTokens.value) }, signal });
      message(status, `Run ${run.id}: ${run.status}`, "muted");
      await loadRuns();
      const stream = await request("GET", `/v1/agent/${chooser.value}/runs/${run.id}/events?stream=true`, { signal });
      for await (const e of sse(stream)) {
        events.append(h("tr", { class: "agent-event", dataset: { type: e.type } }, h("td", {}, String(e.seq)), h("td", {}, e.type), h("td", {}, h("code", {}, JSON.stringify(e.data)))));
        if (e.type === "message.delta" && e.data && e.data.content) output.append(e.data.content);
        if (e.data && e.data.status) message(status, `Run ${run.id}: ${e.data.status}`, "muted");
      }
      await loadRuns();
    } catch (error) { message(status, error.message); } finally {
      output.dataset.done = "yes";
      start.disabled = false;
    }
  });
  await loadAgents();
}

async function chatAndAgents(area, d, signal) {
  await chat(area, d, signal);
  await agents(area, d, signal);
}

// ---------------------------------------------------------------- embeddings

async function embeddings(area, d) {
  const input = h("textarea", { id: "embed-input" }, "a cat sits on the mat\na kitten rests on a rug\nthe stock market fell today");
  const go = h("button", { type: "submit", id: "embed-send" }, "Embed");
  const out = h("div", { id: "embed-result" });
  const form = h("form", {}, h("p", { class: "muted" }, "One text per line."), input, go);
  area.append(h("section", { class: "card" }, h("h3", {}, `Embeddings with ${d.model}`), form, out));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const texts = input.value.split("\n").map((t) => t.trim()).filter(Boolean);
    try {
      const answer = await api("POST", "/v1/embeddings", { body: { model: d.model, input: texts } });
      const vectors = answer.data.map((e) => e.embedding);
      const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0)) || 1;
      const cos = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0) / (norm(a) * norm(b));
      const cell = (value) => {
        const td = h("td", {}, value.toFixed(3));
        td.style.backgroundColor = `rgba(59, 111, 216, ${Math.max(0, value).toFixed(3)})`;
        return td;
      };
      replace(out, h("p", { class: "muted" }, `${vectors.length} vectors of ${vectors[0].length} dimensions; cosine similarity:`),
        h("table", { class: "matrix" }, h("tr", {}, h("th"), texts.map((_, i) => h("th", {}, `#${i + 1}`))),
          vectors.map((a, i) => h("tr", {}, h("th", { title: texts[i] }, `#${i + 1} ${texts[i].slice(0, 40)}`), vectors.map((b) => cell(cos(a, b)))))));
    } catch (error) { message(out, error.message); }
  });
}

// ---------------------------------------------------------------- any task: a form from OpenAPI

function input(name, schema, required) {
  const type = schema.type;
  if (schema.enum) return h("select", { name }, (required ? [] : [h("option", { value: "" }, "")]).concat(schema.enum.map((v) => h("option", { value: String(v), selected: v === schema.default }, String(v)))));
  if (type === "boolean") return h("input", { type: "checkbox", name, checked: schema.default === true });
  if (type === "integer" || type === "number") return h("input", { type: "number", name, step: type === "integer" ? "1" : "any", value: schema.default != null ? String(schema.default) : "" });
  if (type === "string" && schema.format !== "binary") return h("textarea", { name, rows: "2" }, schema.default != null ? String(schema.default) : "");
  const example = schema.examples && schema.examples.length ? schema.examples[0] : null;
  const options = schema.anyOf || schema.oneOf || [];
  if (options.some((o) => o.type === "string")) {
    // text, or JSON when it starts like a list or an object
    const initial = schema.default != null ? schema.default : required ? example : null;
    return h("textarea", { name, rows: "2", placeholder: "text, or JSON ([...] / {...})", dataset: { flex: "yes" } },
      initial == null ? "" : typeof initial === "string" ? initial : JSON.stringify(initial));
  }
  const initial = schema.default != null ? schema.default : required ? example : null;
  return h("textarea", { name, rows: "3", placeholder: "JSON", dataset: { json: "yes" } }, initial != null ? JSON.stringify(initial) : "");
}

async function generic(area, d) {
  const doc = await openApi();
  const ops = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    const op = item.post;
    if (op && (op["x-modelhost-pipelines"] || []).includes(d.pipeline) && op.requestBody && op.requestBody.content["application/json"]) ops.push([path, op]);
  }
  if (!ops.length) return area.append(h("p", { class: "muted" }, `No JSON endpoint serves ${d.pipeline}.`));
  const endpoint = h("select", { id: "task-endpoint" }, ops.map(([path, op]) => h("option", { value: path }, `${path} — ${op.summary || ""}`)));
  const formArea = h("div");
  const out = h("div", { id: "task-result" });
  area.append(h("section", { class: "card" }, h("h3", {}, `${d.pipeline} with ${d.model}`), field("Endpoint", endpoint), formArea, out));
  const build = () => {
    const [path, op] = ops.find(([p]) => p === endpoint.value);
    const schema = resolve(op.requestBody.content["application/json"].schema, doc);
    const required = new Set(schema.required || []);
    const inputs = [];
    const fields = [];
    const files = new Map(); // field → { uri, preview } chosen with its file button
    let preview = null; // the image given, to draw boxes over
    for (const [name, raw] of Object.entries(schema.properties || {})) {
      if (name === "model") continue;
      const s = resolve(raw, doc);
      const el = input(name, s, required.has(name));
      inputs.push([name, el, s]);
      const label = `${name}${required.has(name) ? " *" : ""}${s.description ? ` — ${s.description}` : ""}`;
      const media = /^(image|images|audio|video|file|mask|input_reference)$/.test(name) || /base64/i.test(JSON.stringify(s));
      if (el.tagName === "TEXTAREA" && media) {
        // media fields take a data URI: a file button fills it (base64 stays out of the text box)
        const picker = h("input", { type: "file", name: `${name}-file`, class: "media-file" });
        const note = h("span", { class: "muted" });
        picker.addEventListener("change", async () => {
          const file = picker.files[0];
          if (!file) { files.delete(name); note.textContent = ""; return; }
          const uri = await new Promise((done, fail) => { const r = new FileReader(); r.onload = () => done(r.result); r.onerror = fail; r.readAsDataURL(file); });
          files.set(name, { uri, image: file.type.startsWith("image/") ? URL.createObjectURL(file) : null });
          note.textContent = ` ${file.name} (${file.size} bytes) will be sent as a data URI`;
          el.value = "";
        });
        fields.push(h("div", {}, field(label, el), h("div", { class: "row" }, h("span", { class: "muted" }, "or a file:"), picker, note)));
      } else fields.push(h("div", {}, field(label, el)));
    }
    const form = h("form", { id: "task-form" }, fields, h("button", { type: "submit", id: "task-send" }, "Run"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = { model: d.model };
      try {
        preview = null;
        for (const [name, el, s] of inputs) {
          if (files.has(name)) {
            const chosen = files.get(name);
            body[name] = s.type === "array" ? [chosen.uri] : chosen.uri;
            preview = preview || chosen.image;
            continue;
          }
          if (el.type === "checkbox") { if (el.checked !== (s.default === true)) body[name] = el.checked; continue; }
          const v = el.value.trim();
          if (v === "") continue;
          if (el.dataset.json) body[name] = JSON.parse(v);
          else if (el.dataset.flex) body[name] = /^[[{]/.test(v) ? JSON.parse(v) : v;
          else if (s.type === "integer" || s.type === "number") body[name] = Number(v);
          else body[name] = v;
        }
      } catch (error) { return message(out, `A JSON field does not parse: ${error.message}`); }
      replace(out, h("p", { class: "muted" }, "running…"));
      try {
        const response = await request("POST", path, { body });
        await show(out, response, preview);
      } catch (error) { message(out, error.message); }
    });
    replace(formArea, form);
  };
  endpoint.addEventListener("change", build);
  build();
}

// Render an answer: media as a player or an image, JSON as text plus what it holds (label scores as bars,
// boxes over nothing but their coordinates, images and audio given as base64).
async function show(out, response, preview = null) {
  const type = response.headers.get("Content-Type") || "";
  if (type.startsWith("audio/")) {
    const url = URL.createObjectURL(await response.blob());
    return replace(out, h("audio", { controls: true, src: url }));
  }
  if (type.startsWith("image/")) {
    const url = URL.createObjectURL(await response.blob());
    return replace(out, h("img", { src: url, alt: "answer" }));
  }
  if (type.startsWith("text/")) return replace(out, h("pre", { id: "task-text" }, await response.text()));
  const data = await response.json();
  replace(out);
  const bars = labelScores(data);
  if (bars.length) out.append(barChart(bars));
  const texts = captions(data);
  if (texts.length) out.append(h("div", { id: "task-text" }, texts.map((t) => h("p", { class: "caption" }, t))));
  const found = boxes(data);
  if (found.length && preview) out.append(drawBoxes(preview, found));
  const segments = [data].flat().filter((x) => x && Array.isArray(x.masks));
  if (segments.length && preview) out.append(await drawMasks(preview, segments[0]));
  for (const src of images(data)) out.append(h("img", { src, alt: "image", class: "answer-image" }));
  out.append(h("pre", { id: "task-json" }, JSON.stringify(truncate(data), null, 2)));
}

function labelScores(data) {
  const found = [];
  const walk = (v) => {
    if (Array.isArray(v)) {
      if (v.length && v.every((x) => x && typeof x === "object" && typeof x.score === "number" && (x.label != null || x.token_str != null || x.answer != null))) {
        found.push(...v.map((x) => [String(x.label ?? x.token_str ?? x.answer), x.score]));
        return;
      }
      v.forEach(walk);
    } else if (v && typeof v === "object") Object.values(v).forEach(walk);
  };
  walk(data);
  return found.slice(0, 30);
}

function barChart(pairs) {
  const top = Math.max(...pairs.map(([, s]) => Math.abs(s)), 1e-9);
  const max = top <= 1 ? 1 : top; // probabilities on a 0–1 scale
  return h("table", { class: "bars", id: "task-bars" }, pairs.map(([label, score]) => {
    const bar = h("div", { class: "bar" });
    bar.style.width = `${Math.round((200 * Math.abs(score)) / max)}px`;
    return h("tr", {}, h("td", {}, label), h("td", {}, bar), h("td", {}, score.toFixed(4)));
  }));
}

function images(data) {
  const found = [];
  const walk = (v, key) => {
    if (typeof v === "string") {
      if (/^data:image\/(png|jpeg|webp);base64,/.test(v)) found.push(v);
      else if (key === "url" && v.startsWith(`${location.origin}/v1/files/`)) found.push(v);
      else if (key === "b64_json" || key === "depth") {
        if (/^[A-Za-z0-9+/=]{64,}$/.test(v)) found.push(`data:image/png;base64,${v}`);
      }
    } else if (Array.isArray(v)) v.forEach((x) => walk(x, key));
    else if (v && typeof v === "object") Object.entries(v).forEach(([k, x]) => walk(x, k));
  };
  walk(data, "");
  return found.slice(0, 12);
}

// Generated text: captions, answers, summaries, translations, transcriptions.
function captions(data) {
  const found = [];
  const walk = (v, key) => {
    if (typeof v === "string") {
      if (["generated_text", "summary_text", "translation_text", "text", "caption", "answer"].includes(key)) found.push(v);
    } else if (Array.isArray(v)) v.forEach((x) => walk(x, key));
    else if (v && typeof v === "object") Object.entries(v).forEach(([k, x]) => walk(x, k));
  };
  walk(data, "");
  return found.slice(0, 20);
}

// Detection boxes ({label, score, box: {xmin, ymin, xmax, ymax}} in the image's pixels).
function boxes(data) {
  const list = Array.isArray(data) ? data.flat(2) : [];
  return list.filter((x) => x && typeof x === "object" && x.box && typeof x.box.xmin === "number");
}

function drawBoxes(src, found) {
  const img = h("img", { src, alt: "input image" });
  const frame = h("div", { class: "boxes", id: "task-boxes" }, img);
  img.addEventListener("load", () => {
    const scale = img.clientWidth / img.naturalWidth || 1;
    for (const f of found) {
      const box = h("div", { class: "box" }, h("span", {}, `${f.label} ${(f.score || 0).toFixed(2)}`));
      box.style.left = `${f.box.xmin * scale}px`;
      box.style.top = `${f.box.ymin * scale}px`;
      box.style.width = `${(f.box.xmax - f.box.xmin) * scale}px`;
      box.style.height = `${(f.box.ymax - f.box.ymin) * scale}px`;
      frame.append(box);
    }
  });
  return frame;
}

function loadImage(src) {
  return new Promise((done, fail) => {
    const img = new Image();
    img.onload = () => done(img);
    img.onerror = () => fail(new Error("an image did not decode"));
    img.src = src;
  });
}

const TINTS = [[229, 72, 77], [59, 111, 216], [18, 161, 80], [217, 164, 0], [142, 78, 198], [0, 160, 170]];

// Segments: each mask (a grey PNG, 255 inside) tinted in its colour over the image given.
async function drawMasks(src, seg) {
  const base = await loadImage(src);
  const canvas = h("canvas", { id: "task-masks", width: String(base.naturalWidth), height: String(base.naturalHeight) });
  const ctx = canvas.getContext("2d");
  ctx.drawImage(base, 0, 0);
  const picture = ctx.getImageData(0, 0, canvas.width, canvas.height);
  const legend = h("div", { class: "row" });
  for (const [i, mask] of seg.masks.entries()) {
    const [r, g, b] = TINTS[i % TINTS.length];
    const img = await loadImage(mask.startsWith("data:") ? mask : `data:image/png;base64,${mask}`);
    const scratch = document.createElement("canvas");
    scratch.width = canvas.width;
    scratch.height = canvas.height;
    const sctx = scratch.getContext("2d");
    sctx.drawImage(img, 0, 0, canvas.width, canvas.height);
    const m = sctx.getImageData(0, 0, canvas.width, canvas.height).data;
    const p = picture.data;
    for (let j = 0; j < m.length; j += 4) {
      if (m[j] > 127) { p[j] = (p[j] + r) >> 1; p[j + 1] = (p[j + 1] + g) >> 1; p[j + 2] = (p[j + 2] + b) >> 1; }
    }
    const swatch = h("span", { class: "swatch" });
    swatch.style.backgroundColor = `rgb(${r}, ${g}, ${b})`;
    const score = seg.scores && seg.scores[i] != null ? ` ${seg.scores[i].toFixed(2)}` : "";
    legend.append(h("span", { class: "segment" }, swatch, ` ${seg.labels ? seg.labels[i] : i}${score}`));
  }
  ctx.putImageData(picture, 0, 0);
  return h("div", { class: "masks" }, canvas, legend);
}

function truncate(v) {
  if (typeof v === "string" && v.length > 300) return `${v.slice(0, 300)}… (${v.length} characters)`;
  if (Array.isArray(v)) return v.length > 50 ? [...v.slice(0, 50).map(truncate), `… ${v.length - 50} more`] : v.map(truncate);
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, truncate(x)]));
  return v;
}

// ---------------------------------------------------------------- video jobs

async function video(area, d, signal) {
  const prompt = h("textarea", { id: "video-prompt" }, "a cat walking");
  const seconds = h("input", { type: "number", id: "video-seconds", value: "1", step: "any", min: "0.1" });
  const size = h("input", { type: "text", id: "video-size", value: "256x256" });
  const steps = h("input", { type: "number", id: "video-steps", min: "1", placeholder: "model's" });
  const go = h("button", { type: "submit", id: "video-send" }, "Generate");
  const bar = h("progress", { id: "video-progress", value: "0", max: "100" });
  const status = h("span", { id: "video-status" });
  const player = h("div", { id: "video-player" });
  const form = h("form", {}, field("Prompt", prompt), h("div", { class: "row" }, field("Seconds", seconds), field("Size", size), field("Steps", steps), go));
  area.append(h("section", { class: "card" }, h("h3", {}, `Video with ${d.model}`), form, h("p", {}, bar, " ", status), player));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    go.disabled = true;
    replace(player);
    try {
      const body = { model: d.model, prompt: prompt.value, seconds: Number(seconds.value), size: size.value };
      if (steps.value) body.num_inference_steps = Number(steps.value);
      let job = await api("POST", "/v1/videos", { body, signal });
      while (job.status === "queued" || job.status === "in_progress") {
        bar.value = job.progress;
        status.textContent = `${job.status} (${job.progress} %)`;
        await new Promise((done) => setTimeout(done, 500));
        if (signal.aborted) return;
        job = await api("GET", `/v1/videos/${job.id}`, { signal });
      }
      bar.value = job.progress;
      status.textContent = job.status + (job.error ? `: ${job.error.message}` : "");
      if (job.status === "completed") {
        const blob = await (await request("GET", `/v1/videos/${job.id}/content`, { signal })).blob();
        replace(player, h("video", { controls: true, src: URL.createObjectURL(blob) }));
      }
    } catch (error) { message(status, error.message); } finally { go.disabled = false; }
  });
}

const PLAYGROUNDS = { "text-generation": chatAndAgents, "image-text-to-text": chat, "feature-extraction": embeddings, "text-to-video": video };
