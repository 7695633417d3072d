// Evals: the account's evals (OpenAI's Evals API, docs/evals.md), newest first, each with its latest runs,
// refreshed every 2 s: a run's status, its progress (items graded of the total) and each criterion's pass
// rate; "Items" shows a run's per-item grades, and each item's sample as text (model output is never
// parsed as HTML). Evals and runs are made with the API or `modelhost evals`.
import { api } from "../api.js";
import { badge, confirmButton, h, message, replace } from "../dom.js";

const EVERY_MS = 2000;
const LISTED = 20; // the newest evals listed
const RUNS = 5; // the newest runs of each
const ITEMS = 100; // a run's items shown (the API's largest page)
const ACTIVE = new Set(["queued", "in_progress"]);

export async function render(main) {
  const status = h("p", { id: "evals-status" });
  const list = h("div", { id: "eval-list" });
  const items = h("section", { class: "card", id: "eval-items", hidden: true });
  replace(main, h("h2", {}, "Evals"),
    h("section", { class: "card" }, h("h3", {}, "Your evals"),
      h("p", { class: "muted" }, "Grade a deployment on your own test set: created with the Evals API (POST /v1/evals) or `modelhost evals create`; runs with `modelhost evals run`."),
      list, status),
    items);

  let seen = "";
  async function refresh() {
    const evals = await api("GET", `/v1/evals?limit=${LISTED}&order=desc`);
    const runs = await Promise.all(evals.data.map((e) =>
      api("GET", `/v1/evals/${encodeURIComponent(e.id)}/runs?limit=${RUNS}&order=desc`)));
    const now = JSON.stringify([evals, runs]);
    if (now === seen) return; // unchanged: a Cancel button armed by a click stays armed
    seen = now;
    replace(list, evals.data.length
      ? evals.data.map((e, i) => card(e, runs[i].data))
      : h("p", { class: "muted" }, "No evals yet."));
  }

  function card(e, runs) {
    const criteria = (e.testing_criteria || []).map((c) => `${c.name} (${c.type})`).join(", ");
    return h("article", { class: "eval", dataset: { id: e.id } },
      h("h4", {}, e.name || e.id, " ", h("code", { class: "muted" }, e.id)),
      h("p", { class: "muted criteria" }, criteria),
      h("table", { class: "eval-runs" },
        h("thead", {}, h("tr", {}, ["Run", "Status", "Progress", "Pass rates", "Created", ""].map((t) => h("th", {}, t)))),
        h("tbody", {}, runs.length ? runs.map((r) => runRow(e, r))
          : h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No runs yet.")))));
  }

  function runRow(e, r) {
    const counts = r.result_counts || { total: 0, passed: 0, failed: 0, errored: 0 };
    const graded = counts.passed + counts.failed + counts.errored;
    const rates = (r.per_testing_criteria_results || []).map((c) => {
      const total = c.passed + c.failed;
      return h("div", { class: "rate", dataset: { criterion: c.testing_criteria } },
        `${c.testing_criteria}: ${c.passed}/${total} (${total ? Math.round((100 * c.passed) / total) : 0} %)`);
    });
    const cancel = ACTIVE.has(r.status) ? confirmButton("Cancel", async () => {
      try { await api("POST", `/v1/evals/${encodeURIComponent(e.id)}/runs/${encodeURIComponent(r.id)}`); message(status, ""); } catch (error) { message(status, error.message); }
      seen = "";
      await refresh();
    }) : null;
    return h("tr", { dataset: { id: r.id, status: r.status } },
      h("td", { class: "run" }, h("code", {}, r.id), h("div", { class: "muted" }, [r.name, r.model].filter(Boolean).join(" · "))),
      h("td", { class: "status" }, badge(r.status), r.error && r.error.message ? h("div", { class: "error" }, r.error.message) : null),
      h("td", { class: "progress" }, h("progress", { max: String(counts.total || 1), value: String(graded) }), " ", h("span", { class: "done" }, `${graded} / ${counts.total}`)),
      h("td", { class: "rates" }, rates),
      h("td", { class: "created" }, r.created_at ? new Date(r.created_at * 1000).toLocaleString() : ""),
      h("td", { class: "actions" },
        h("button", { type: "button", class: "secondary", onclick: () => showItems(e, r) }, "Items"), " ", cancel));
  }

  async function showItems(e, r) {
    try {
      const page = await api("GET", `/v1/evals/${encodeURIComponent(e.id)}/runs/${encodeURIComponent(r.id)}/output_items?limit=${ITEMS}&order=asc`);
      items.hidden = false;
      replace(items, h("h3", {}, `The items of ${r.id}`),
        h("table", { id: "eval-item-list" },
          h("thead", {}, h("tr", {}, ["Item", "Status", "Grades", "Sample"].map((t) => h("th", {}, t)))),
          h("tbody", {}, page.data.map((item) => h("tr", { dataset: { id: item.id, status: item.status } },
            h("td", {}, String(item.datasource_item_id)),
            h("td", { class: "status" }, badge(item.status)),
            h("td", { class: "grades" }, (item.results || []).map((g) => h("div", {},
              `${g.name}: ${typeof g.score === "number" ? g.score.toFixed(3) : "-"} ${g.passed ? "pass" : "fail"}`))),
            h("td", { class: "sample" }, h("pre", {}, sampleText(item.sample))))))),
        page.has_more ? h("p", { class: "muted" }, `The first ${ITEMS} are shown.`) : null);
    } catch (error) { message(status, error.message); }
  }

  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), EVERY_MS);
  return () => clearInterval(timer);
}

// A sample's answer as text: its output messages' contents (a completions run's), or the `output_text`
// a jsonl run's item gave.
function sampleText(sample) {
  if (!sample) return "";
  const output = (sample.output || []).map((m) => (typeof m.content === "string" ? m.content : JSON.stringify(m.content)));
  return output.length ? output.join("\n") : String(sample.output_text ?? "");
}
