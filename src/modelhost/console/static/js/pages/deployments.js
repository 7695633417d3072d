// Deployments: create from a ready artifact (an adapter on its base), change readiness, replica bounds,
// engine and a generation deployment's settings (context length, chat template), delete; live state, the engine in use and per-deployment requests/s, latency and batch size
// from /metrics; a gated rollout's steps and decisions. Adapter deployments are listed under their base:
// they have no replicas of their own.
import { api, request } from "../api.js";
import { badge, confirmButton, field, h, message, replace } from "../dom.js";
import { deployForm, ENGINES, GENERATION_TASKS, READINESS, select, settingsBody, settingsInputs } from "../deploy.js";
import { DeploymentRates, parseMetrics } from "../metrics.js";
import { plot } from "../plot.js";

// A generation deployment's settings in one line: what is set, and `auto` for the parsers it leaves to
// the replica's detection.
function settingsText(d) {
  const kwargs = Object.keys(d.chat_template_kwargs || {}).length ? ` · template arguments ${JSON.stringify(d.chat_template_kwargs)}` : "";
  return `Context: ${d.max_model_len ?? "the model's"} · chat template: ${d.chat_template ? `set (${d.chat_template.length} characters)` : "the artifact's"}` +
    `${kwargs} · tool parser: ${d.tool_parser ?? "auto"} · reasoning parser: ${d.reasoning_parser ?? "auto"}`;
}

// A gated rollout (docs/deploy.md, "Gated rollouts"): its state, its steps with the one under way marked,
// and every decision with its reason and figures. Text nodes only: a reason may quote a model's output.
function rolloutView(r) {
  if (!r) return [];
  const steps = r.gate.steps.map((p, i) => h("li", { class: i === r.step ? "step current" : "step" }, `${p} %`));
  const figures = (d) => [
    d.scores ? `scores: candidate ${d.scores.candidate}, current ${d.scores.current}` : null,
    d.metrics ? `metrics: ${Object.entries(d.metrics).map(([k, v]) => `${k} ${v}`).join(", ")}` : null,
    d.traffic ? `traffic: ${Object.entries(d.traffic).map(([a, p]) => `${a} ${p} %`).join(", ")}` : null,
  ].filter(Boolean).join(" · ");
  const rows = r.decisions.map((d) => h("tr", { dataset: { decision: d.decision } },
    h("td", {}, d.at), h("td", {}, d.step === null ? "" : String(d.step)), h("td", {}, d.decision),
    h("td", { class: "reason" }, d.reason), h("td", { class: "muted" }, figures(d))));
  const runs = Object.entries(r.eval_runs || {}).map(([which, id]) => `${which} ${id}`).join(", ");
  return [
    h("h4", {}, `Gated rollout of ${r.candidate} (from ${r.current}): `, badge(r.state)),
    h("p", { class: "muted" }, `eval ${r.gate.eval_id} · margin ${r.gate.margin} · ${r.gate.step_seconds} s a step` + (runs ? ` · runs: ${runs}` : "")),
    h("ol", { class: "rollout-steps" }, ...steps),
    h("table", { class: "rollout-decisions" }, h("thead", {}, h("tr", {}, ...["at", "step", "decision", "reason", "figures"].map((t) => h("th", {}, t)))), h("tbody", {}, ...rows)),
  ];
}

export async function render(main) {
  const status = h("p", { id: "deployments-status" });
  const artifacts = (await api("GET", "/v1/model-artifacts")).data.filter((a) => a.status === "ready");
  const deploy = deployForm({ artifacts, status, onDeployed: () => refresh() });
  const list = h("div", { id: "deployment-list" });
  replace(main, h("h2", {}, "Deployments"), h("section", { class: "card" }, h("h3", {}, "New deployment"), deploy.form, status), list);

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
    const generation = GENERATION_TASKS.includes(d.pipeline);
    const settings = generation ? settingsInputs((name) => `${d.id}-${name}`, d) : null;
    const parsers = h("p", { class: "generation-settings muted" });
    const apply = h("button", { type: "button", class: "secondary" }, "Apply");
    apply.addEventListener("click", async () => {
      try {
        const body = { readiness: ready.value, min_replicas: Number(lo.value), max_replicas: Number(hi.value) };
        if (engine.value !== c.asked) body.engine = engine.value; // given, the engine is chosen again
        if (settings) Object.assign(body, settingsBody(settings, c.current)); // changed: the replicas reload
        await api("PATCH", `/v1/deployments/${encodeURIComponent(d.id)}`, { body });
        message(note, "saved", "ok");
        await refresh();
      } catch (error) { message(note, error.message); }
    });
    const remove = confirmButton("Delete", async () => {
      try { await api("DELETE", `/v1/deployments/${encodeURIComponent(d.id)}`); await refresh(); } catch (error) { message(note, error.message); }
    });
    const plots = { rps: h("div"), latency: h("div"), batch: h("div"), tokens: h("div", { class: "tokens" }) };
    const rollout = h("div", { class: "rollout" });
    const el = h("section", { class: "card deployment", dataset: { id: d.id, model: d.model } },
      h("h3", {}, d.model, " ", state), h("p", { class: "muted" }, `${d.pipeline} · ${d.id} · artifact ${d.artifact_id}`), reason,
      h("p", {}, "Replicas loaded: ", replicas), h("p", {}, "Engine: ", inUse), generation ? parsers : null,
      h("div", { class: "row" }, field("Readiness", ready), field("Min replicas", lo), field("Max replicas", hi), field("Engine", engine),
        settings ? settings.fields : null, apply, remove, note), rollout,
      h("div", { class: "plots" }, plots.rps, plots.latency, plots.batch, plots.tokens));
    const c = { el, state, reason, replicas, inUse, asked: d.engine, plots, parsers, current: d, rollout };
    return c;
  }

  // An adapter deployment: its state and readiness are its base's, its requests run on the base's
  // replicas (the base's plots count them); it is deleted here, rolled out to another adapter by the API
  // or the CLI: its versions' split and a gated rollout's decisions are shown.
  function adapterCard(d) {
    const state = h("span", { class: "state" });
    const reason = h("div", { class: "error reason" });
    const baseName = h("span", { class: "base-model" });
    const note = h("span");
    const split = h("p", { class: "versions" });
    const rollout = h("div", { class: "rollout" });
    const remove = confirmButton("Delete", async () => {
      try { await api("DELETE", `/v1/deployments/${encodeURIComponent(d.id)}`); await refresh(); } catch (error) { message(note, error.message); }
    });
    const el = h("section", { class: "card deployment adapter", dataset: { id: d.id, model: d.model, base: d.base_deployment } },
      h("h3", {}, d.model, " ", state), h("p", { class: "base-of" }, "adapter of ", baseName),
      h("p", { class: "muted" }, `${d.pipeline} · ${d.id} · readiness, replicas and engine are the base's`),
      split, reason, rollout, h("div", { class: "row" }, remove, note));
    return { el, state, reason, baseName, split, rollout, adapter: true };
  }

  async function refresh() {
    const data = (await api("GET", "/v1/deployments")).data;
    deploy.setBases(data);
    const names = new Map(data.map((d) => [d.id, d.model]));
    const seen = new Set();
    for (const d of data) {
      seen.add(d.id);
      if (!cards.has(d.id)) cards.set(d.id, d.base_deployment ? adapterCard(d) : card(d));
      const c = cards.get(d.id);
      replace(c.state, badge(d.state));
      c.el.dataset.state = d.state;
      c.reason.textContent = d.state_reason || "";
      if (c.adapter) {
        c.baseName.textContent = names.get(d.base_deployment) || d.base_deployment; // a shared base: its ID
        c.split.textContent = (d.versions.length > 1 ? "versions: " : "artifact ") +
          d.versions.map((v) => d.versions.length > 1 ? `${v.artifact_id} ${v.traffic} %` : v.artifact_id).join(", ");
        const shownRollout = JSON.stringify(d.rollout);
        if (c.rollout.dataset.shown !== shownRollout) { replace(c.rollout, ...rolloutView(d.rollout)); c.rollout.dataset.shown = shownRollout; }
        c.el.dataset.rollout = d.rollout ? d.rollout.state : "";
        continue;
      }
      c.inUse.textContent = d.engine_in_use + (d.engine_reason ? ` (${d.engine_reason})` : "");
      c.asked = d.engine;
      c.current = d;
      c.parsers.textContent = settingsText(d);
      const seen_ = JSON.stringify(d.rollout);
      if (c.rollout.dataset.shown !== seen_) { replace(c.rollout, ...rolloutView(d.rollout)); c.rollout.dataset.shown = seen_; }
      c.el.dataset.rollout = d.rollout ? d.rollout.state : "";
      c.replicas.textContent = `${d.replicas} (bounds ${d.min_replicas}–${d.max_replicas}), ${d.memory_gb.toFixed(3)} GB` +
        (d.last_cold_start_seconds ? `, last cold start ${d.last_cold_start_seconds.toFixed(1)} s` : "");
    }
    for (const [id, c] of cards) if (!seen.has(id)) { c.el.remove(); cards.delete(id); }
    // each base followed by its adapters; an adapter whose base is not listed (shared by the operator) last
    const order = [];
    for (const d of data) {
      if (d.base_deployment) continue;
      order.push(d.id);
      for (const a of data) if (a.base_deployment === d.id) order.push(a.id);
    }
    for (const d of data) if (d.base_deployment && !names.has(d.base_deployment)) order.push(d.id);
    const shown = [...list.querySelectorAll(":scope > section.deployment")].map((el) => el.dataset.id);
    if (shown.join() !== order.join()) list.append(...order.map((id) => cards.get(id).el));
    if (!data.length && !list.querySelector(".muted")) list.append(h("p", { class: "muted" }, "No deployments yet."));
    if (data.length) list.querySelectorAll(":scope > p.muted").forEach((p) => p.remove());
    await metrics([...cards.keys()].filter((id) => !cards.get(id).adapter));
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
