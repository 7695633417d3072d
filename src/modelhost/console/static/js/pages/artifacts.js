// Artifacts: import one from S3, HTTPS or a Hub (the server fetches it; its progress followed here), or
// create one and upload a model folder through the upload-session API, with a progress bar
// per file and in total; each file's sha256 is computed here and checked against the server's. The list
// shows each artifact's kind (a LoRA adapter with its rank, alpha, target modules and size; a quantized
// model with its method, bits and where it can be served), and a ready one deploys from its row (an
// adapter on the base deployment it asks for). Model-controlled strings (a GGUF's architecture, a config's
// quant_method) are text nodes, never markup.
import { api, authHeaders, openApi, resolve } from "../api.js";
import { adapterDetails, deployForm } from "../deploy.js";
import { confirmButton, field, h, message, replace, when } from "../dom.js";

const HASH_LIMIT = 2 ** 30; // bytes read into memory to hash one file in the browser

// What inspection found in a quantized model: method, scheme, bits, group size, a GGUF's architecture and
// file type, and per engine and device kind whether it can be served here (and why not).
function quantizationDetails(a) {
  const { method, bits, group_size: group, scheme } = a.quantization;
  const words = [method, scheme, bits ? `${bits}-bit` : null, group ? `group ${group}` : null].filter(Boolean);
  const serving = Object.entries(a.serving || {}).flatMap(([engine, devices]) =>
    Object.entries(devices).map(([device, why]) =>
      h("li", { class: why ? "not-servable" : "servable", dataset: { engine, device } },
        `${engine} on ${device}: ${why || "servable"}`)));
  return h("div", { class: "quantization-details muted" },
    h("span", { class: "quantization" }, words.join(" · ")),
    a.gguf ? h("div", { class: "gguf" }, `GGUF ${a.gguf.architecture}, context ${a.gguf.context_length ?? "?"}`,
      a.gguf.parts > 1 ? `, ${a.gguf.parts} parts` : null, a.gguf.mmproj_file ? ", vision projector" : null) : null,
    h("ul", { class: "serving" }, serving));
}

function bytesText(done, total) {
  return total ? `${done} of ${total} bytes (${Math.round((100 * done) / total)} %)` : `${done} bytes`;
}

// Import a model from where it lives (s3://, https://, hf://): the server fetches, verifies and inspects
// it; this card creates the artifact, starts the import and follows its progress until it ends.
function importCard(pipelines, refreshList) {
  const source = h("input", { type: "text", id: "import-source", placeholder: "s3://bucket/prefix, hf://org/name, https://…" });
  const name = h("input", { type: "text", id: "import-name", placeholder: "my model" });
  const pipeline = h("select", { id: "import-pipeline" }, pipelines.map((p) => h("option", { value: p }, p)));
  const button = h("button", { type: "submit", id: "import-start" }, "Import");
  const bar = h("progress", { id: "import-total", value: "0", max: "1" });
  const text = h("span", { id: "import-text" });
  const result = h("div", { id: "import-result" });
  const form = h("form", { class: "row", id: "import-form" }, field("Source", source), field("Display name", name), field("Pipeline task", pipeline), button);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const given = source.value.trim();
    if (!given) return message(result, "Give a source first.");
    button.disabled = true;
    replace(result);
    try {
      const display = name.value.trim() || given.replace(/[/@]+$/, "").split("/").pop() || "model";
      const artifact = await api("POST", "/v1/model-artifacts", { body: { display_name: display, pipeline: pipeline.value } });
      const base = `/v1/model-artifacts/${artifact.id}/imports`;
      let shown = await api("POST", base, { body: { source: given } });
      await refreshList();
      while (!["completed", "failed", "cancelled"].includes(shown.status)) {
        await new Promise((done) => setTimeout(done, 1000));
        shown = await api("GET", `${base}/${shown.id}`);
        bar.max = shown.bytes_total || 1;
        bar.value = shown.bytes_done;
        const files = shown.files.filter((f) => f.status === "done").length;
        text.textContent = `${shown.status}: ${files}/${shown.files.length} files, ${bytesText(shown.bytes_done, shown.bytes_total)}`;
      }
      replace(result, h("p", { class: shown.status === "completed" ? "ok" : "error", id: "import-status" }, `${display}: import ${shown.status}`),
        shown.error ? h("p", { class: "error" }, `${shown.error.code}: ${shown.error.message}`) : null);
    } catch (error) {
      message(result, `Import failed: ${error.message}`);
    } finally {
      button.disabled = false;
      await refreshList();
    }
  });
  return h("section", { class: "card" }, h("h3", {}, "Import a model"), form, h("p", {}, "Progress ", bar, " ", text), result);
}

function hex(buffer) {
  return [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// PUT one file with upload progress (fetch has none); resolves with the server's answer.
function put(url, file, sha256, onProgress) {
  return new Promise((resolvePut, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", url);
    for (const [k, v] of Object.entries(authHeaders())) xhr.setRequestHeader(k, v);
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    if (sha256) xhr.setRequestHeader("X-Content-SHA256", sha256);
    xhr.upload.onprogress = (e) => onProgress(e.loaded);
    xhr.onload = () => {
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch { body = null; }
      if (xhr.status === 200) resolvePut(body);
      else reject(new Error((body && body.error && body.error.message) || `HTTP ${xhr.status}`));
    };
    xhr.onerror = () => reject(new Error("network error"));
    xhr.send(file);
  });
}

// The file's path inside the model folder: its relative path without the chosen folder's own name.
function pathOf(file) {
  const rel = file.webkitRelativePath || file.name;
  const parts = rel.split("/");
  return parts.length > 1 ? parts.slice(1).join("/") : rel;
}

export async function render(main) {
  const doc = await openApi();
  const pipelines = resolve(resolve(doc.components.schemas.ArtifactCreate, doc).properties.pipeline, doc).enum || [];
  const name = h("input", { type: "text", id: "artifact-name", placeholder: "my model" });
  const pipeline = h("select", { id: "artifact-pipeline" }, pipelines.map((p) => h("option", { value: p }, p)));
  const folder = h("input", { type: "file", id: "artifact-folder", webkitdirectory: true, multiple: true });
  const button = h("button", { type: "submit", id: "artifact-upload" }, "Create and upload");
  const form = h("form", { class: "row", id: "artifact-form" }, field("Display name", name), field("Pipeline task", pipeline), field("Model folder", folder), button);
  const totalBar = h("progress", { id: "upload-total", value: "0", max: "1" });
  const totalText = h("span");
  const files = h("tbody", { id: "upload-files" });
  const result = h("div", { id: "upload-result" });
  const rows = h("tbody");
  const imported = importCard(pipelines, () => refresh());
  replace(main, h("h2", {}, "Artifacts"),
    imported,
    h("section", { class: "card" }, h("h3", {}, "Upload a model folder"), form,
      h("p", {}, "Total ", totalBar, " ", totalText),
      h("table", {}, h("thead", {}, h("tr", {}, ["File", "Size", "Progress", "sha256"].map((t) => h("th", {}, t)))), files), result),
    h("section", { class: "card" }, h("h3", {}, "Your artifacts"),
      h("table", { id: "artifact-list" }, h("thead", {}, h("tr", {}, ["Name", "Task", "Kind", "Status", "Size (GB)", "Created", ""].map((t) => h("th", {}, t)))), rows)));

  folder.addEventListener("change", () => {
    if (!name.value && folder.files.length) name.value = (folder.files[0].webkitRelativePath || "model").split("/")[0];
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const chosen = [...folder.files];
    if (!chosen.length) return message(result, "Choose a model folder first.");
    button.disabled = true;
    replace(result);
    try {
      await upload(chosen);
    } catch (error) {
      message(result, `Upload failed: ${error.message}`);
    } finally {
      button.disabled = false;
      await refresh();
    }
  });

  async function upload(chosen) {
    const totalBytes = chosen.reduce((n, f) => n + f.size, 0) || 1;
    const done = new Map();
    totalBar.max = totalBytes;
    const bars = chosen.map((f) => {
      const bar = h("progress", { value: "0", max: String(f.size || 1) });
      const sum = h("span", { class: "muted" }, "…");
      return { bar, sum };
    });
    replace(files, bars.map((b, i) => h("tr", { class: "upload-file", dataset: { path: pathOf(chosen[i]) } },
      h("td", {}, pathOf(chosen[i])), h("td", {}, `${chosen[i].size} B`), h("td", {}, b.bar), h("td", {}, b.sum))));
    const showTotal = () => {
      const sent = [...done.values()].reduce((a, b) => a + b, 0);
      totalBar.value = sent;
      totalText.textContent = `${Math.round((100 * sent) / totalBytes)} % of ${totalBytes} bytes`;
    };
    const artifact = await api("POST", "/v1/model-artifacts", { body: { display_name: name.value.trim() || "model", pipeline: pipeline.value } });
    const started = await api("POST", `/v1/model-artifacts/${artifact.id}/uploads`);
    const base = `/v1/model-artifacts/${artifact.id}/uploads/${started.upload_id}`;
    for (const [i, f] of chosen.entries()) {
      const { bar, sum } = bars[i];
      // Web Crypto hashes a whole buffer at once: files above HASH_LIMIT are left to the server's digest
      let digest = null;
      if (crypto.subtle && f.size <= HASH_LIMIT) digest = hex(await crypto.subtle.digest("SHA-256", await f.arrayBuffer()));
      const path = pathOf(f).split("/").map(encodeURIComponent).join("/");
      const answer = await put(`${base}/files/${path}`, f, digest, (loaded) => { bar.value = loaded; done.set(i, loaded); showTotal(); });
      bar.value = f.size || 1;
      done.set(i, f.size);
      showTotal();
      if (digest && answer.sha256 !== digest) throw new Error(`${pathOf(f)}: the server stored sha256 ${answer.sha256}, the browser computed ${digest}`);
      const why = crypto.subtle ? `larger than ${HASH_LIMIT / 2 ** 30} GiB: not hashed in the browser` : "crypto.subtle needs HTTPS or localhost";
      sum.textContent = digest ? `${digest.slice(0, 16)}… verified` : `${answer.sha256.slice(0, 16)}… (not verified: ${why})`;
      sum.className = digest ? "ok" : "muted";
    }
    const finished = await api("POST", `${base}/complete`);
    const a = finished.artifact;
    replace(result, h("h3", {}, "Inspection"),
      h("p", { class: a.status === "ready" ? "ok" : "error", id: "inspection-status" }, `${a.display_name}: ${a.status}`),
      h("p", {}, finished.message),
      a.error ? h("p", { class: "error" }, `${a.error.code}: ${a.error.message}`) : null,
      h("pre", {}, JSON.stringify(a, null, 2)));
  }

  // the deploy form of one artifact, in a row under its own (one open at a time)
  let open = null;
  async function toggleDeploy(a, tr) {
    const was = open && open.dataset.artifact;
    if (open) { open.remove(); open = null; }
    if (was === a.id) return;
    const status = h("p", { id: "artifact-deploy-status" });
    const deployments = (await api("GET", "/v1/deployments")).data;
    const deploy = deployForm({ fixed: a, deployments, prefix: "artifact-deploy", status, onDeployed: async () => {
      status.append(" ", h("a", { href: "#deployments" }, "See it on Deployments"));
      deploy.setBases((await api("GET", "/v1/deployments")).data);
    } });
    open = h("tr", { class: "artifact-deploy", dataset: { artifact: a.id } },
      h("td", { colspan: 7 }, h("h4", {}, a.kind === "adapter" ? `Deploy ${a.display_name} on a base deployment` : `Deploy ${a.display_name}`),
        deploy.form, status));
    tr.after(open);
  }

  async function refresh() {
    open = null;
    const list = (await api("GET", "/v1/model-artifacts")).data;
    replace(rows, list.map((a) => {
      const tr = h("tr", { dataset: { id: a.id, kind: a.kind } },
        h("td", {}, a.display_name), h("td", {}, a.pipeline),
        h("td", { class: "kind" }, a.kind, a.adapter ? adapterDetails(a) : null,
          a.quantization ? quantizationDetails(a) : null),
        h("td", {}, a.status, a.import_id ? h("div", { class: "muted import-progress" }, `importing: ${bytesText(a.bytes_done, a.bytes_total)}`) : null,
          a.error ? h("div", { class: "error" }, `${a.error.code}: ${a.error.message}`) : null),
        h("td", {}, (a.size_gb).toFixed(6)), h("td", {}, when(a.created_at)),
        h("td", { class: "actions" },
          a.status === "ready" ? h("button", { type: "button", class: "secondary deploy", onclick: () => toggleDeploy(a, tr).catch((error) => message(result, error.message)) }, "Deploy") : null,
          " ",
          confirmButton("Delete", async () => {
            try { await api("DELETE", `/v1/model-artifacts/${a.id}`); } catch (error) { message(result, error.message); }
            await refresh();
          })));
      return tr;
    }));
    if (!list.length) replace(rows, h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No artifacts yet.")));
  }
  await refresh();
}
