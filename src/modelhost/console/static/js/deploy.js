// The deploy form: on the Deployments page (any ready artifact) and under an artifact's row on the
// Artifacts page. A LoRA adapter artifact (docs/adapters.md) asks for its base deployment instead:
// readiness, replicas and engine follow the base's, so they are neither shown nor sent.
import { api } from "./api.js";
import { field, h, message, replace } from "./dom.js";

export const READINESS = ["cold", "warm", "hot"];
export const ENGINES = ["auto", "vllm", "llamacpp", "onnxruntime", "openvino", "transformers"];
const BASE_TASKS = ["text-generation", "image-text-to-text"]; // the tasks whose deployments serve adapters
export const GENERATION_TASKS = BASE_TASKS; // the tasks with generation settings (docs/generation.md)

// A generation deployment's context length and chat template, as inputs (empty: the artifact's own).
export function settingsInputs(id, d = {}) {
  const maxModelLen = h("input", { type: "number", id: id("max-model-len"), min: "16", placeholder: "the model's", value: d.max_model_len ? String(d.max_model_len) : "" });
  const chatTemplate = h("textarea", { id: id("chat-template"), rows: "3", placeholder: "the artifact's chat template (Jinja)" });
  chatTemplate.value = d.chat_template || "";
  return { maxModelLen, chatTemplate, fields: [field("Max model length", maxModelLen), field("Chat template", chatTemplate)] };
}

// The settings as the API takes them: every one whose input differs from `d` (empty: null, unset).
export function settingsBody({ maxModelLen, chatTemplate }, d = {}) {
  const body = {};
  const length = maxModelLen.value ? Number(maxModelLen.value) : null;
  if (length !== (d.max_model_len ?? null)) body.max_model_len = length;
  const template = chatTemplate.value || null;
  if (template !== (d.chat_template ?? null)) body.chat_template = template;
  return body;
}

export function select(options, value, id) {
  return h("select", { id }, options.map(([v, label]) => h("option", { value: v, selected: v === value }, label)));
}

// The account's deployments an adapter can be deployed on: full models of a task that serves adapters
// (the server checks the rest: the engine, the modules the adapter fits).
export function bases(deployments) {
  return deployments.filter((d) => !d.base_deployment && BASE_TASKS.includes(d.pipeline));
}

function size(bytes) {
  const units = ["B", "kB", "MB", "GB"];
  let n = bytes;
  let i = 0;
  for (; n >= 1000 && i < units.length - 1; i++) n /= 1000;
  return i ? `${n.toFixed(1)} ${units[i]}` : `${n} B`;
}

// What inspection found in an adapter artifact: rank, alpha, target modules, size, and the base it was
// trained on (as PEFT wrote it).
export function adapterDetails(a) {
  const { rank, alpha, target_modules: targets, bytes, base_model_name_or_path: trainedOn } = a.adapter;
  return h("div", { class: "adapter-details muted" },
    h("span", { class: "rank" }, `rank ${rank}`), " · ", h("span", { class: "alpha" }, `alpha ${alpha}`), " · ",
    h("span", { class: "targets" }, [targets].flat().join(", ")), " · ", h("span", { class: "bytes" }, size(bytes)),
    trainedOn ? h("div", { class: "trained-on" }, `trained on ${trainedOn}`) : null);
}

// The form. `artifacts`: the ready artifacts to choose from, or `fixed`: the one artifact it deploys;
// `status`: where it says what happened; `prefix`: its elements' IDs. `setBases(deployments)` updates
// the base choices (the Deployments page calls it on each refresh).
export function deployForm({ artifacts = [], fixed = null, deployments = [], prefix = "deploy", status, onDeployed }) {
  const id = (name) => `${prefix}-${name}`;
  const model = h("input", { type: "text", id: id("model"), placeholder: "my-model" });
  const artifact = h("select", { id: id("artifact") }, artifacts.map((a) =>
    h("option", { value: a.id }, `${a.display_name} (${a.kind === "adapter" ? "adapter, " : ""}${a.pipeline}, ${a.id})`)));
  if (!artifacts.length) replace(artifact, h("option", { value: "" }, "no ready artifact: upload one first"));
  const readiness = select(READINESS.map((r) => [r, r]), "warm", id("readiness"));
  const min = h("input", { type: "number", id: id("min"), value: "1", min: "0", max: "64" });
  const max = h("input", { type: "number", id: id("max"), value: "1", min: "1", max: "64" });
  const engine = select(ENGINES.map((e) => [e, e]), "auto", id("engine"));
  const settings = settingsInputs(id);
  // a select of the bases listed, and a typed ID or name for any other (a base the operator shares)
  const base = h("select", { id: id("base") });
  const typed = h("input", { type: "text", id: id("base-name"), placeholder: "deployment ID or model name" });
  const modelFields = [field("Readiness", readiness), field("Min replicas", min), field("Max replicas", max), field("Engine", engine)];
  const generationFields = settings.fields;
  const baseField = field("Base deployment", base);
  const typedField = field("Base ID or model name", typed);
  const form = h("form", { class: "row", id: id("form") }, field("Model ID", model),
    fixed ? null : field("Ready artifact", artifact), baseField, typedField, modelFields, generationFields, h("button", { type: "submit" }, "Deploy"));
  const chosen = () => fixed || artifacts.find((a) => a.id === artifact.value) || null;
  let listed = null;
  let other = false; // the user chose to type the base

  function sync() {
    const adapter = (chosen() || {}).kind === "adapter";
    form.dataset.kind = adapter ? "adapter" : "model";
    baseField.hidden = !adapter;
    typedField.hidden = !adapter || base.value !== "";
    for (const f of modelFields) f.hidden = adapter;
    const generation = !adapter && GENERATION_TASKS.includes((chosen() || {}).pipeline);
    for (const f of generationFields) f.hidden = !generation;
  }

  function setBases(deployments) {
    const choices = bases(deployments);
    const key = choices.map((d) => `${d.id} ${d.engine_in_use}`).join();
    if (key === listed) return; // unchanged: the choice the user is making stays open
    listed = key;
    const was = base.value;
    replace(base, choices.map((d) => h("option", { value: d.id, selected: d.id === was }, `${d.model} (${d.pipeline}, ${d.engine_in_use}, ${d.id})`)),
      h("option", { value: "", selected: other }, "another: type its ID or model name"));
    sync();
  }

  artifact.addEventListener("change", sync);
  base.addEventListener("change", () => { other = base.value === ""; sync(); });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const a = chosen();
    if (!a) return message(status, "Upload an artifact first.");
    const body = { model: model.value.trim(), artifact_id: a.id };
    if (a.kind === "adapter") {
      body.base_deployment = base.value || typed.value.trim();
      if (!body.base_deployment) return message(status, "Name the base deployment the adapter is served on.");
    } else {
      Object.assign(body, { readiness: readiness.value, min_replicas: Number(min.value), max_replicas: Number(max.value), engine: engine.value });
      if (GENERATION_TASKS.includes(a.pipeline)) Object.assign(body, settingsBody(settings));
    }
    try {
      const created = await api("POST", "/v1/deployments", { body });
      message(status, `Deployed ${created.model} (${created.id})${created.base_deployment ? ` on ${created.base_deployment}` : ""}.`, "ok");
      if (onDeployed) await onDeployed(created);
    } catch (error) { message(status, error.message); }
  });
  setBases(deployments);
  return { form, setBases };
}
