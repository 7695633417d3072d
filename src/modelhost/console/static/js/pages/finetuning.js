// Fine-tuning: the account's fine-tuning jobs (OpenAI's API, docs/fine-tuning.md), newest first, refreshed
// every 2 s: status (and why a job waits or failed), the base and the fine-tuned model, progress (steps of
// the total) and the latest training and validation loss; "Events" shows a job's events and checkpoints
// as text; Cancel (a second click confirms) while a job is under way. Jobs are made with the API or
// `modelhost fine-tune create`.
import { api } from "../api.js";
import { badge, confirmButton, h, message, replace } from "../dom.js";

const EVERY_MS = 2000;
const LISTED = 50; // the newest jobs listed
const EVENTS = 100; // a job's newest events shown (the API's largest page)
const ACTIVE = new Set(["validating_files", "queued", "running", "paused"]);

export async function render(main) {
  const status = h("p", { id: "fine-tuning-status" });
  const rows = h("tbody");
  const detail = h("section", { class: "card", id: "fine-tuning-detail", hidden: true });
  replace(main, h("h2", {}, "Fine-tuning"),
    h("section", { class: "card" }, h("h3", {}, "Your fine-tuning jobs"),
      h("p", { class: "muted" }, "LoRA adapters trained on a deployment's base: created with the fine-tuning API (POST /v1/fine_tuning/jobs) or `modelhost fine-tune create`."),
      h("table", { id: "job-list" }, h("thead", {}, h("tr", {}, ["Job", "Status", "Progress", "Loss", "Fine-tuned model", ""].map((t) => h("th", {}, t)))), rows),
      status),
    detail);

  // job ID → { seen: its JSON and loss, tr, cancel }: a row is rebuilt only when it changed, and keeps its
  // Cancel button, so that a click arming it is not undone by the next refresh
  const shown = new Map();
  async function refresh() {
    const list = await api("GET", `/v1/fine_tuning/jobs?limit=${LISTED}`);
    for (const job of list.data) {
      const loss = job.status === "running" || !shown.has(job.id) ? await latestLoss(job.id) : shown.get(job.id).loss;
      const seen = JSON.stringify([job, loss]);
      const before = shown.get(job.id);
      if (before?.seen === seen) continue;
      const cancel = ACTIVE.has(job.status) ? (before?.cancel || cancelButton(job)) : null;
      shown.set(job.id, { seen, loss, tr: row(job, loss, cancel), cancel });
    }
    replace(rows, list.data.length ? list.data.map((j) => shown.get(j.id).tr)
      : h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No fine-tuning jobs yet.")));
  }

  function cancelButton(job) {
    return confirmButton("Cancel", async () => {
      try { await api("POST", `/v1/fine_tuning/jobs/${encodeURIComponent(job.id)}/cancel`); message(status, ""); } catch (error) { message(status, error.message); }
      await refresh();
    });
  }

  function row(job, loss, cancel) {
    const why = job.error ? h("div", { class: "error" }, job.error.message) : job.waiting_reason ? h("div", { class: "muted waiting" }, job.waiting_reason) : null;
    const total = job.total_steps || 0;
    return h("tr", { dataset: { id: job.id, status: job.status } },
      h("td", { class: "job" }, h("code", {}, job.id), h("div", { class: "muted" }, `on ${job.model}`)),
      h("td", { class: "status" }, badge(job.status), why),
      h("td", { class: "progress" }, h("progress", { max: String(total || 1), value: String(job.step || 0) }), " ",
        h("span", { class: "done" }, `${job.step || 0} / ${total}`)),
      h("td", { class: "loss" }, loss ? `training ${loss.train_loss.toFixed(4)}${loss.valid_loss == null ? "" : `, validation ${loss.valid_loss.toFixed(4)}`}` : ""),
      h("td", { class: "model" }, job.fine_tuned_model ? h("code", {}, job.fine_tuned_model) : ""),
      h("td", { class: "actions" }, h("button", { type: "button", class: "secondary", onclick: () => showEvents(job) }, "Events"), " ", cancel));
  }

  async function showEvents(job) {
    try {
      const path = `/v1/fine_tuning/jobs/${encodeURIComponent(job.id)}`;
      const [events, checkpoints] = await Promise.all([api("GET", `${path}/events?limit=${EVENTS}`), api("GET", `${path}/checkpoints`)]);
      detail.hidden = false;
      replace(detail, h("h3", {}, `The events of ${job.id}`),
        h("ul", { id: "job-checkpoints", class: "muted" }, checkpoints.data.map((c) =>
          h("li", {}, `${c.fine_tuned_model_checkpoint} (step ${c.step_number})`))),
        h("pre", { id: "job-events" }, events.data.slice().reverse().map((e) =>
          `${new Date(e.created_at * 1000).toLocaleTimeString()} ${e.message}`).join("\n")));
    } catch (error) { message(status, error.message); }
  }

  // The newest `metrics` event of a job: its step's losses.
  async function latestLoss(jobId) {
    const events = await api("GET", `/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/events?limit=${EVENTS}`);
    const metrics = events.data.find((e) => e.type === "metrics" && e.data);
    return metrics ? metrics.data : null;
  }

  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), EVERY_MS);
  return () => clearInterval(timer);
}
