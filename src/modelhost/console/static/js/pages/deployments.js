// Deployments: create from a ready artifact, change readiness, replica bounds and engine, delete; live
// state, the engine in use and per-deployment requests/s, latency and batch size from /metrics.
import { api, request } from "../api.js";
import { badge, confirmButton, field, h, message, replace } from "../dom.js";
import { DeploymentRates, parseMetrics } from "../metrics.js";
import { plot } from "../plot.js";

const READINESS = ["cold", "warm", "hot"];
const ENGINES = ["auto", "vllm", "onnxruntime", "openvino", "transformers"];

function select(options, value, id) {
  return h("select", { id }, options.map(([v, label]) => h("option", { value: v, selected: v === value }, label)));
}

export async function render(main) {
  const status = h("p", { id: "deployments-status" });
  const model = h("input", { type: "text", id: "deploy-model", placeholder: "my-model" });
  const artifact = h("select", { id: "deploy-artifact" });
  const readiness = select(READINESS.map((r) => [r, r]), "warm", "deploy-readiness");
  const min = h("input", { type: "number", id: "deploy-min", value: "1", min: "0", max: "64" });
  const max = h("input", { type: "number", id: "deploy-max", value: "1", min: "1", max: "64" });
  const engine = select(ENGINES.map((e) => [e, e]), "auto", "deploy-engine");
  const form = h("form", { class: "row", id: "deploy-form" }, field("Model ID", model), field("Ready artifact", artifact),
    field("Readiness", readiness), field("Min replicas", min), field("Max replicas", max), field("Engine", engine),
    h("button", { type: "submit" }, "Deploy"));
  const list = h("div", { id: "deployment-list" });
  replace(main, h("h2", {}, "Deployments"), h("section", { class: "card" }, h("h3", {}, "New deployment"), form, status), list);

  const artifacts = (await api("GET", "/v1/model-artifacts")).data.filter((a) => a.status === "ready");
  replace(artifact, artifacts.map((a) => h("option", { value: a.id }, `${a.display_name} (${a.pipeline}, ${a.id})`)));
  if (!artifacts.length) replace(artifact, h("option", { value: "" }, "no ready artifact: upload one first"));

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const created = await api("POST", "/v1/deployments", { body: {
        model: model.value.trim(), artifact_id: artifact.value, readiness: readiness.value,
        min_replicas: Number(min.value), max_replicas: Number(max.value), engine: engine.value } });
      message(status, `Deployed ${created.model} (${created.id}).`, "ok");
      await refresh();
    } catch (error) { message(status, error.message); }
  });

  const cards = new Map();
  const rates = new DeploymentRates();

  function card(d) {
    const state = h("span", { class: "state" });
    const reason = h("div", { class: "error reason" });
    const replicas = h("span", { class: "replicas" });
    const inUse = h("span", { class: "engine-in-use" });
    const ready = select(READINESS.map((r) => [r, r]), d.readiness);
    ready.className = "readiness";
    const engine = select(ENGINES.map((e) => [e, e]), d.engine);
    engine.className = "engine";
    const lo = h("input", { type: "number", value: String(d.min_replicas), min: "0", max: "64" });
    const hi = h("input", { type: "number", value: String(d.max_replicas), min: "1", max: "64" });
    const note = h("span");
    const apply = h("button", { type: "button", class: "secondary" }, "Apply");
    apply.addEventListener("click", async () => {
      try {
        const body = { readiness: ready.value, min_replicas: Number(lo.value), max_replicas: Number(hi.value) };
        if (engine.value !== c.asked) body.engine = engine.value; // given, the engine is chosen again
        await api("PATCH", `/v1/deployments/${encodeURIComponent(d.id)}`, { body });
        message(note, "saved", "ok");
        await refresh();
      } catch (error) { message(note, error.message); }
    });
    const remove = confirmButton("Delete", async () => {
      try { await api("DELETE", `/v1/deployments/${encodeURIComponent(d.id)}`); await refresh(); } catch (error) { message(note, error.message); }
    });
    const plots = { rps: h("div"), latency: h("div"), batch: h("div"), tokens: h("div", { class: "tokens" }) };
    const el = h("section", { class: "card deployment", dataset: { id: d.id, model: d.model } },
      h("h3", {}, d.model, " ", state), h("p", { class: "muted" }, `${d.pipeline} · ${d.id} · artifact ${d.artifact_id}`), reason,
      h("p", {}, "Replicas loaded: ", replicas), h("p", {}, "Engine: ", inUse),
      h("div", { class: "row" }, field("Readiness", ready), field("Min replicas", lo), field("Max replicas", hi), field("Engine", engine),
        apply, remove, note),
      h("div", { class: "plots" }, plots.rps, plots.latency, plots.batch, plots.tokens));
    const c = { el, state, reason, replicas, inUse, asked: d.engine, plots };
    return c;
  }

  async function refresh() {
    const data = (await api("GET", "/v1/deployments")).data;
    const seen = new Set();
    for (const d of data) {
      seen.add(d.id);
      if (!cards.has(d.id)) { const c = card(d); cards.set(d.id, c); list.append(c.el); }
      const c = cards.get(d.id);
      replace(c.state, badge(d.state));
      c.el.dataset.state = d.state;
      c.reason.textContent = d.state_reason || "";
      c.inUse.textContent = d.engine_in_use + (d.engine_reason ? ` (${d.engine_reason})` : "");
      c.asked = d.engine;
      c.replicas.textContent = `${d.replicas} (bounds ${d.min_replicas}–${d.max_replicas}), ${d.memory_gb.toFixed(3)} GB` +
        (d.last_cold_start_seconds ? `, last cold start ${d.last_cold_start_seconds.toFixed(1)} s` : "");
    }
    for (const [id, c] of cards) if (!seen.has(id)) { c.el.remove(); cards.delete(id); }
    if (!data.length && !list.querySelector(".muted")) list.append(h("p", { class: "muted" }, "No deployments yet."));
    if (data.length) list.querySelectorAll(":scope > p.muted").forEach((p) => p.remove());
    await metrics([...cards.keys()]);
  }

  async function metrics(ids) {
    const text = await (await request("GET", "/metrics")).text();
    rates.add(parseMetrics(text), ids);
    for (const id of ids) {
      const h_ = rates.history.get(id);
      if (!h_) continue;
      const c = cards.get(id);
      plot(c.plots.rps, { title: "requests/s", labels: ["requests/s", "in flight"], x: h_.t, ys: [h_.rps, h_.inFlight], width: 340, height: 150 });
      plot(c.plots.latency, { title: "latency (ms per model call)", labels: ["ms"], x: h_.t, ys: [h_.latency], width: 340, height: 150 });
      plot(c.plots.batch, { title: "batch size", labels: ["requests per call", "sequences generating"], x: h_.t, ys: [h_.batch, h_.generating], width: 340, height: 150 });
      plot(c.plots.tokens, { title: "tokens generated/s", labels: ["tokens/s"], x: h_.t, ys: [h_.tokens], width: 340, height: 150 });
      c.plots.tokens.dataset.peak = String(Math.max(0, ...h_.tokens)); // the highest rate shown
    }
  }

  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), 2000);
  return () => clearInterval(timer);
}
