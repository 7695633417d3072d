// Prometheus text exposition (GET /metrics, the public scrape endpoint) parsed in the browser.

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = LINE.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(LABEL)) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

export function total(samples, name, labels = {}) {
  let sum = 0;
  for (const s of samples) {
    if (s.name !== name) continue;
    if (Object.entries(labels).every(([k, v]) => s.labels[k] === v)) sum += s.value;
  }
  return sum;
}

// Per deployment: requests/s, mean latency (ms) and mean batch size between successive scrapes, from
// the replicas' batch histograms; generation engines batch continuously and report the sequences they
// hold and the tokens they produce instead (and every gateway its requests in flight).
export class DeploymentRates {
  constructor(limit = 60) { this.limit = limit; this.last = null; this.history = new Map(); }

  add(samples, deploymentIds, now = Date.now() / 1000) {
    const current = new Map();
    for (const id of deploymentIds) {
      const d = { deployment: id };
      current.set(id, {
        requests: total(samples, "modelhost_batch_size_sum", d),
        calls: total(samples, "modelhost_batch_size_count", d),
        seconds: total(samples, "modelhost_inference_seconds_sum", d),
        timed: total(samples, "modelhost_inference_seconds_count", d),
        generating: total(samples, "modelhost_generation_sequences", d),
        tokens: total(samples, "modelhost_generation_tokens_total", d),
        inFlight: total(samples, "modelhost_requests_in_flight", d),
      });
    }
    if (this.last) {
      const dt = Math.max(now - this.last.at, 1e-3);
      for (const [id, c] of current) {
        const p = this.last.values.get(id);
        if (!p) continue;
        const calls = c.calls - p.calls;
        const timed = c.timed - p.timed;
        const h = this.history.get(id) || { t: [], rps: [], latency: [], batch: [], generating: [], inFlight: [], tokens: [] };
        h.t.push(now);
        h.rps.push(Math.max(0, (c.requests - p.requests) / dt));
        h.latency.push(timed > 0 ? ((c.seconds - p.seconds) / timed) * 1000 : null);
        h.batch.push(calls > 0 ? (c.requests - p.requests) / calls : null);
        h.generating.push(c.generating);
        h.inFlight.push(c.inFlight);
        h.tokens.push(Math.max(0, (c.tokens - p.tokens) / dt));
        for (const k of Object.keys(h)) h[k] = h[k].slice(-this.limit);
        this.history.set(id, h);
      }
    }
    this.last = { at: now, values: current };
  }
}
