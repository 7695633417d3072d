"""Prometheus metrics of the runtime, labelled by deployment, from whichever process records them.

Replicas record what happens inside them (queue depth, batch sizes, inference time, held sequences),
gateway processes what they have in flight, the supervisor loads, replicas and memory. `/metrics` on
any gateway process adds them up (`modelhost.metrics`).
"""

from __future__ import annotations

from modelhost.metrics import Counter, Gauge, Histogram

QUEUE_DEPTH = Gauge(
    "modelhost_queue_depth",
    "Requests waiting in a deployment's replicas for the model.",
    ["deployment"],
    multiprocess_mode="livesum",
)
IN_FLIGHT = Gauge(
    "modelhost_requests_in_flight",
    "Requests and generations a gateway process (`pid`) has sent to a deployment and not yet answered.",
    ["deployment"],
    multiprocess_mode="liveall",
)
BATCH_SIZE = Histogram(
    "modelhost_batch_size",
    "Requests per model call (from every gateway process: they meet in the replica).",
    ["deployment"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
INFERENCE_SECONDS = Histogram(
    "modelhost_inference_seconds",
    "Time of one batched model call, in the replica.",
    ["deployment"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
# The OpenTelemetry GenAI semantic conventions' server metrics, under their Prometheus names (seconds,
# their buckets), as a generation's caller sees them: measured in the gateway from its dispatch, queues
# and prefill included (docs/operations.md, "Metrics").
TIME_TO_FIRST_TOKEN = Histogram(
    "gen_ai_server_time_to_first_token_seconds",
    "Time from a generation's dispatch to its first token (GenAI semantic conventions).",
    ["deployment"],
    buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10),
)
# The same, by version (artifact) of the deployment: a gated rollout judges its candidate's p50 on it
# (docs/deploy.md, "Gated rollouts"). One more observation per generation, kept in the tally
VERSION_TIME_TO_FIRST_TOKEN = Histogram(
    "modelhost_version_time_to_first_token_seconds",
    "Time from a generation's dispatch to its first token, by deployment and the artifact (version) "
    "that generated it.",
    ["deployment", "artifact_id"],
    buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10),
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "gen_ai_server_time_per_output_token_seconds",
    "Time per output token after the first, per generation (GenAI semantic conventions).",
    ["deployment"],
    buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5),
)
COLD_STARTS = Counter("modelhost_cold_starts_total", "Deployment loads (cold starts).", ["deployment"])
LOAD_SECONDS = Histogram(
    "modelhost_load_seconds", "Time to load a deployment's replicas.", ["deployment"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)  # fmt: skip
LOADED_REPLICAS = Gauge(
    "modelhost_loaded_replicas", "Replicas loaded now.", ["deployment"], multiprocess_mode="livesum"
)
MEMORY_BYTES = Gauge(
    "modelhost_replica_memory_bytes",
    "Memory a deployment's replicas add to the machine (their footprint: host and GPU; docs/runtime.md).",
    ["deployment"],
    multiprocess_mode="livesum",
)
REPLICA_RESTARTS = Counter(
    "modelhost_replica_restarts_total",
    "Replicas replaced, by `reason`: `exited` (the worker died: killed, crashed, out of the system's "
    "memory) or `memory` (the supervisor stopped it above `MODELHOST_REPLICA_MEMORY_LIMIT_MB`).",
    ["deployment", "reason"],
)
REQUESTS_REQUEUED = Counter(
    "modelhost_requests_requeued_total",
    "Requests sent again to another replica (or the replacement) because theirs died: before running "
    "them, or (once per request) while running them.",
    ["deployment"],
)
GENERATIONS_MIGRATED = Counter(
    "modelhost_generations_migrated_total",
    "Generations that went on on another replica, by `reason`: `died` (theirs died with tokens already "
    "sent) or `drained` (theirs handed them off: a rollout's old version, a scale-down); and background "
    "responses that went on in another gateway process: `taken_over` (theirs died or stopped).",
    ["deployment", "reason"],
)
GENERATING = Gauge(
    "modelhost_generation_sequences",
    "Sequences held by a deployment's generation engines (running or waiting).",
    ["deployment"],
    multiprocess_mode="livesum",
)
GENERATION_TOKENS = Counter(
    "modelhost_generation_tokens_total",
    "Completion tokens a deployment's generation engines produced (as `usage` counts them), whether or "
    "not their client was still there to read them; on vLLM, as its engine hands them to the replica.",
    ["deployment"],
)
GENERATION_REQUESTS = Counter(
    "modelhost_generation_requests_total",
    "Generations a deployment's replicas started, by the service tier they ran in (`tier`: priority, "
    "default or flex; a batch job's lines count as flex).",
    ["deployment", "tier"],
)
# The engines' KV cache, as each replica's engine sees it (docs/operations.md, "Metrics"). One series per
# replica process (`pid`): what a router or a dashboard compares is replicas, and the fullest one
# (`max by (deployment)`) is what says that new requests will wait.
KV_CACHE_USAGE = Gauge(
    "modelhost_kv_cache_usage_ratio",
    "Fraction of a replica's KV cache held by the sequences it runs and prefills (the transformers "
    "engine and llama.cpp: their busy slots over their slots, each slot a whole context; 1: new requests "
    "wait; vLLM: the blocks its requests hold over its blocks, from its scheduler), one series per "
    "replica process (`pid`).",
    ["deployment"],
    multiprocess_mode="liveall",
)
# Prompt tokens looked up in the engines' prefix caches and those found there, as vLLM counts its own
# `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits`: hits over queries is the cache's hit rate.
PREFIX_CACHE_QUERIES = Counter(
    "modelhost_prefix_cache_queries_tokens_total",
    "Prompt tokens of the generations a deployment's engines started, each looked up in its replica's "
    "prefix cache.",
    ["deployment"],
)
PREFIX_CACHE_HITS = Counter(
    "modelhost_prefix_cache_hits_tokens_total",
    "Prompt tokens a deployment's engines found in their replica's prefix cache (computed before) "
    "instead of computing them.",
    ["deployment"],
)
ENGINE = Gauge(
    "modelhost_deployment_engine",
    "1 for the engine (`transformers`, `vllm`) a deployment's replicas run, set when one loads.",
    ["deployment", "engine"],
    multiprocess_mode="livemostrecent",
)
MEMORY_BUDGET = Gauge(
    "modelhost_memory_budget_bytes",
    "Host memory that replicas may take together (`MODELHOST_MEMORY_BUDGET_MB`, or 80 % of the machine's "
    "or cgroup's memory less the server's own processes).",
    multiprocess_mode="livemax",
)
MEMORY_RESERVED = Gauge(
    "modelhost_memory_reserved_bytes",
    "Host memory reserved by deployments that hold or are taking memory: measured footprints of loaded "
    "replicas, predicted ones of replicas loading, and replicas being stopped until they have exited.",
    multiprocess_mode="livemax",
)
GPU_MEMORY_BUDGET = Gauge(
    "modelhost_gpu_memory_budget_bytes",
    "A GPU's memory that replicas may take together (`MODELHOST_GPU_MEMORY_FRACTION` of it).",
    ["gpu"],
    multiprocess_mode="livemax",
)
GPU_MEMORY_RESERVED = Gauge(
    "modelhost_gpu_memory_reserved_bytes",
    "A GPU's memory reserved by the deployments placed on it.",
    ["gpu"],
    multiprocess_mode="livemax",
)
EVICTIONS = Counter(
    "modelhost_evictions_total",
    "Idle deployments unloaded to make room, by `reason`: `load` (another deployment's load did not "
    "fit) or `over_budget` (measured footprints grew above the budget).",
    ["reason"],
)
CAPACITY_REFUSALS = Counter(
    "modelhost_capacity_refusals_total",
    "Loads refused for memory (503 `insufficient_capacity` after the wait, or at once for a footprint "
    "larger than the budget).",
)
# Autoscaling of the local backend (docs/runtime.md, "Autoscaling (local backend)"); the actual count is
# `modelhost_loaded_replicas`.
SCALE_EVENTS = Counter(
    "modelhost_scale_events_total",
    "Replicas the autoscaler added (`direction` `up`) or took away (`down`), one per event.",
    ["deployment", "direction"],
)
DESIRED_REPLICAS = Gauge(
    "modelhost_desired_replicas",
    "Replicas the autoscaler wants for a deployment now (more than loaded while one starts, or while the "
    "memory budget has no room for it).",
    ["deployment"],
    multiprocess_mode="livesum",
)
