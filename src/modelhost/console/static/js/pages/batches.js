// Batches: the account's batches (the Batch API, docs/batch.md), newest first, refreshed every 2 s: status,
// progress (lines answered, completed or failed, of the total), when each was created and finished, why
// one failed; its output and error files downloaded with the key (fetched, then saved from a blob: URL,
// since a link cannot carry an Authorization header) or their first lines shown as text; a Cancel button
// while one runs.
import { api, request } from "../api.js";
import { badge, confirmButton, h, message, replace } from "../dom.js";

const ENDED = new Set(["completed", "failed", "expired", "cancelled"]);
const PREVIEW_BYTES = 64 * 1024; // a file's first bytes shown on the page; the whole goes to a download
const LISTED = 100; // the newest batches listed (the API's largest page)
const EVERY_MS = 2000;

export async function render(main) {
  const status = h("p", { id: "batches-status" });
  const rows = h("tbody");
  const more = h("p", { class: "muted", id: "batches-more" });
  const preview = h("section", { class: "card", id: "batch-preview", hidden: true });
  replace(main, h("h2", {}, "Batches"),
    h("section", { class: "card" }, h("h3", {}, "Your batches"),
      h("p", { class: "muted" }, "Files of requests answered at low priority, created with the Batch API (POST /v1/batches) or `modelhost batches create`."),
      h("table", { id: "batch-list" }, h("thead", {}, h("tr", {}, ["Batch", "Status", "Progress", "Created", "Finished", "Files", ""].map((t) => h("th", {}, t)))), rows),
      more, status),
    preview);

  // batch ID → { seen: its JSON, tr, cancel }: a row is rebuilt only when its batch changed, and keeps its
  // Cancel button, so that a click arming it is not undone by the next refresh
  const shown = new Map();
  async function refresh() {
    const list = await api("GET", `/v1/batches?limit=${LISTED}`);
    for (const batch of list.data) {
      const seen = JSON.stringify(batch);
      const before = shown.get(batch.id);
      if (before?.seen === seen) continue;
      const cancel = cancellable(batch) ? (before?.cancel || cancelButton(batch)) : null;
      shown.set(batch.id, { seen, tr: row(batch, cancel), cancel });
    }
    replace(rows, list.data.map((b) => shown.get(b.id).tr));
    if (!list.data.length) replace(rows, h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No batches yet.")));
    more.textContent = list.has_more ? `The newest ${LISTED} are shown.` : "";
  }

  function cancelButton(b) {
    return confirmButton("Cancel", async () => {
      try { await api("POST", `/v1/batches/${encodeURIComponent(b.id)}/cancel`); message(status, ""); } catch (error) { message(status, error.message); }
      await refresh();
    });
  }

  function row(b, cancel) {
    const counts = b.request_counts || { total: 0, completed: 0, failed: 0 };
    const done = counts.completed + counts.failed;
    const labels = Object.entries(b.metadata || {}).map(([k, v]) => `${k}=${v}`).join(", ");
    const errors = ((b.errors && b.errors.data) || []).map((e) => h("div", { class: "error" }, describe(e)));
    const files = [["output", b.output_file_id], ["errors", b.error_file_id]].filter(([, id]) => id).map(([what, id]) =>
      h("div", { class: `file ${what}` }, h("span", { class: "what" }, what),
        h("button", { type: "button", class: "secondary", onclick: () => download(id, status) }, "Download"), " ",
        h("button", { type: "button", class: "secondary", onclick: () => show(id, what, b.id) }, "Show")));
    return h("tr", { dataset: { id: b.id, status: b.status } },
      h("td", { class: "batch" }, h("code", {}, b.id), h("div", { class: "muted" }, [b.endpoint, b.model].filter(Boolean).join(" · ")),
        labels ? h("div", { class: "muted metadata" }, labels) : null),
      h("td", { class: "status" }, badge(b.status), errors),
      h("td", { class: "progress" }, h("progress", { max: String(counts.total || 1), value: String(done) }), " ", h("span", { class: "done" }, `${done} / ${counts.total}`),
        h("div", { class: "muted counts", dataset: counts }, `${counts.completed} completed, ${counts.failed} failed`)),
      h("td", { class: "created" }, time(b.created_at)),
      h("td", { class: "finished" }, time(b.completed_at || b.failed_at || b.expired_at || b.cancelled_at)),
      h("td", { class: "files" }, files),
      h("td", { class: "actions" }, cancel));
  }

  // The first lines of a file, as text (model output is never parsed as HTML).
  async function show(fileId, what, batchId) {
    try {
      const response = await request("GET", `/v1/files/${encodeURIComponent(fileId)}/content`);
      const { text, whole } = await head(response);
      preview.hidden = false;
      replace(preview, h("h3", {}, `The ${what} of ${batchId}`),
        h("p", { class: "muted" }, whole ? fileId : `${fileId}: its first lines (download it for the rest)`),
        h("pre", { id: "batch-preview-text" }, text));
    } catch (error) { message(status, error.message); }
  }

  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), EVERY_MS);
  return () => clearInterval(timer);
}

// Save a file fetched with the key: a blob: URL clicked as a download link, under the server's name.
async function download(fileId, status) {
  try {
    const response = await request("GET", `/v1/files/${encodeURIComponent(fileId)}/content`);
    const named = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") || "");
    const url = URL.createObjectURL(await response.blob());
    const link = h("a", { href: url, download: named ? named[1] : `${fileId}.jsonl`, hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (error) { message(status, error.message); }
}

// Read at most PREVIEW_BYTES of a body, ending at a whole line; the rest is not fetched.
async function head(response) {
  const reader = response.body.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    size += value.length;
    if (size >= PREVIEW_BYTES) { await reader.cancel(); break; }
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) { bytes.set(chunk, at); at += chunk.length; }
  const whole = size < PREVIEW_BYTES;
  const text = new TextDecoder().decode(whole ? bytes : bytes.slice(0, PREVIEW_BYTES));
  return { text: whole ? text : text.slice(0, text.lastIndexOf("\n") + 1), whole };
}

function cancellable(batch) {
  return !ENDED.has(batch.status) && batch.status !== "cancelling";
}

function describe(error) {
  const where = error.line != null ? `line ${error.line}: ` : "";
  const why = [error.code, error.param].filter(Boolean).join(", ");
  return `${where}${error.message}${why ? ` (${why})` : ""}`;
}

function time(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "";
}
