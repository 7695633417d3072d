"""The one place settings come from: environment variables prefixed `MODELHOST_` (or a `.env` file).

Embedded defaults need nothing installed: a SQLite file and a data directory under the working
directory. Setting `MODELHOST_DATABASE_URL=postgresql+psycopg://...` switches to PostgreSQL.
"""

from __future__ import annotations

import ipaddress
import os
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def secrets_dir() -> str | None:
    """A folder of secret files, named by `MODELHOST_SECRETS_DIR`: each file named like a setting's
    variable (`MODELHOST_ADMIN_KEY`, `MODELHOST_DATABASE_URL`...) sets it to its contents (pydantic-settings'
    secrets directory). What containers use (a Kubernetes Secret or a compose secret mounted as files):
    secrets in files stay out of the environment, which every worker process inherits and `/proc` shows.
    Environment variables and `.env` still win over a file."""
    return os.environ.get("MODELHOST_SECRETS_DIR") or None


def env_file() -> str | None:
    """The settings file: `.env` in the working directory, another one named by `MODELHOST_ENV_FILE`, or
    none when that is empty. The test suite sets it empty, so that the `.env` that `make run` writes into
    the checkout (the operator's admin key) never reaches the tests' servers."""
    return os.environ.get("MODELHOST_ENV_FILE", ".env") or None


class Settings(BaseSettings):
    """Operator settings. Every field maps to `MODELHOST_<NAME>`."""

    model_config = SettingsConfigDict(
        env_prefix="MODELHOST_", env_file=env_file(), secrets_dir=secrets_dir(), extra="ignore"
    )

    data_dir: Path = Field(
        default=Path("modelhost-data"), description="Artifacts, blobs and the SQLite file."
    )
    database_url: str = Field(
        default="",
        description="SQLAlchemy URL; empty means a SQLite file inside data_dir.",
    )
    admin_key: SecretStr | None = Field(
        default=None,
        description="Bearer key for /v1/admin/*. Unset disables the admin routes.",
    )
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int | None = Field(
        default=None,
        ge=1,
        description="Gateway processes serving HTTP on the port (`serve --workers`); unset: one per four "
        "cores, 1 to 8.",
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        description="Largest JSON/multipart request body accepted (413 above).",
    )
    key_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        description="How long a key lookup is trusted before the database is asked again. "
        "Revocation on this gateway is immediate; other gateways see it within this time.",
    )
    key_cache_entries: int = Field(default=10_000, ge=1)
    auth_failures_per_minute: int = Field(
        default=30,
        ge=0,
        description="Wrong keys one client address may present per minute (per gateway process) before "
        "its unknown keys are answered 429 with Retry-After; 0 turns the throttle off (auth/failures.py).",
    )
    anonymous_requests_per_minute: int = Field(
        default=3000,
        ge=0,
        description="Requests without a key (public routes: health, metrics, the console, sign-in, signed "
        "file links) one client address may send per minute, per gateway process; a sign-in's step counts "
        "as 20 (auth/anonymous.py). Past it: 429 with Retry-After. 0 turns the throttle off.",
    )
    anonymous_burst: int = Field(
        default=600,
        ge=1,
        description="How many of those requests one client address may send at once before the per-minute "
        "rate applies.",
    )
    trusted_proxies: str = Field(
        default="",
        description="The proxies whose `X-Forwarded-For` / `X-Forwarded-Proto` are believed: addresses or "
        "CIDRs, comma-separated (as uvicorn's --forwarded-allow-ips; `*` any). A request from one of them "
        "is the forwarded client's everywhere a client address counts (audit rows, the wrong-key throttle, "
        "logs); empty (the default): no proxy, every request is its TCP peer's, whatever it forwards.",
    )
    oidc_issuer: str | None = Field(
        default=None,
        description="Single sign-on: the OpenID Connect provider's issuer URL (its "
        "`/.well-known/openid-configuration` is read); unset: keys only (docs/access.md).",
    )
    oidc_client_id: str | None = Field(default=None, description="modelhost's client ID at the provider.")
    oidc_client_secret: SecretStr | None = Field(default=None, description="modelhost's client secret.")
    oidc_scopes: str = Field(
        default="openid email profile",
        description="Scopes asked for at sign-in (add the one your provider needs for groups, "
        "e.g. `groups`).",
    )
    oidc_groups_claim: str = Field(default="groups", description="The ID token claim that lists groups.")
    oidc_group_prefix: str = Field(
        default="modelhost",
        description="Groups named `<prefix>:<account ID>:<role>` make their members that role in that "
        "account.",
    )
    oidc_operator_group: str = Field(
        default="modelhost:operator", description="Members of this group are the operator (as the admin key)."
    )
    oidc_algorithms: str = Field(
        default="RS256,RS384,RS512,PS256,PS384,PS512,ES256,ES384,ES512,EdDSA",
        description="Signature algorithms accepted on ID tokens, comma-separated (never `none`, never HMAC).",
    )
    session_idle_seconds: int = Field(
        default=3600, ge=60, description="A sign-in session ends after this long without a request."
    )
    session_max_seconds: int = Field(
        default=12 * 3600,
        ge=60,
        description="A sign-in session ends this long after sign-in, whatever its use.",
    )
    session_renew_seconds: int = Field(
        default=3600,
        ge=10,
        description="A sign-in session is renewed against the OpenID provider this often (with the refresh "
        "token it gave at sign-in): the person's groups, operator group included, are read again, and a "
        "person the provider refuses (deleted, disabled) is signed out. A session without a refresh token "
        "ends then (ask for `offline_access` where the provider needs it).",
    )
    sign_in_key_seconds: int = Field(
        default=30 * 24 * 3600,
        ge=0,
        description="The keys of a person who signs in stop working this long after their last sign-in "
        "(or session renewal), answering 401 `sign_in_required` until they sign in again: someone removed "
        "at the provider keeps no working key. 0: no bound.",
    )
    oidc_trust_email: bool = Field(
        default=False,
        description="Offer invitations to the provider's `email` even without `email_verified: true` (a "
        "directory whose emails only its administrators set); off: only to a verified email.",
    )
    metrics_key: SecretStr | None = Field(
        default=None,
        description="A bearer key for scrapers: with it (or the admin key) /metrics also shows the series "
        "labelled with account IDs (credits billed); without, they are left out.",
    )
    metrics_public: bool = Field(
        default=False,
        description="Serve every /metrics series without a key, account IDs included (a server on a "
        "private network whose scrapers send no key: the behaviour before metrics_key).",
    )
    trace_client_sampling: Literal["authenticated", "always", "never"] = Field(
        default="authenticated",
        description="Whose `traceparent` a request's trace continues (its sampled flag included): only "
        "requests with a valid key (`authenticated`), every request (`always`: a private network), or "
        "none (`never`). Other requests start a trace of their own, linked to the caller's.",
    )
    apply_migrations_on_start: bool = True
    database_wait_seconds: float = Field(
        default=60.0,
        ge=0,
        description="At start, how long a server waits for an unreachable PostgreSQL (and S3 store) "
        "before going on (a container started beside its database; 0: not at all).",
    )
    allow_pickle_weights: bool = Field(
        default=False,
        description="Accept pickle-based weights (.bin, .pt, ...); off because loading them can run code.",
    )
    max_lora_rank: int = Field(
        default=64,
        ge=1,
        le=512,
        description="Highest rank of a LoRA adapter artifact: inspection refuses more. A base serving "
        "adapters sizes vLLM's LoRA slots for it (rounded up to vLLM's next supported rank).",
    )
    max_loras: int = Field(
        default=8,
        ge=1,
        description="Adapters one vLLM replica runs in one batch; more stay in CPU memory (least recently "
        "used first out), loaded again on their next request.",
    )
    max_cpu_loras: int = Field(
        default=64, ge=1, description="Adapters one vLLM replica keeps in CPU memory (at least max_loras)."
    )
    max_upload_file_bytes: int = Field(
        default=50 * 1024**3, ge=1, description="Largest single uploaded file."
    )
    max_upload_files: int = Field(default=10_000, ge=1, description="Most files in one upload session.")
    min_free_disk_mb: int = Field(
        default=64,
        ge=0,
        description="Free space (MB) kept on the data directory's disk: uploads that would go below it are "
        "refused up front (507), and /ready shows `disk: low` under it. Small by default, as CI machines "
        "often have little disk; raise it in production (e.g. to a few GB, above your largest upload).",
    )
    import_archive_max_bytes: int = Field(
        default=256 * 1024**3,
        ge=1,
        description="Most bytes an imported archive (.tar, .tar.gz, .zip) may expand to, counted as they "
        "inflate; it may also expand to at most 100 times its own size (zip and gzip bombs).",
    )
    import_read_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="An import's HTTPS or Hub download fails after this long without a byte (an idle "
        "timeout, not a deadline: a large file that keeps moving takes as long as it takes).",
    )
    upload_session_ttl_seconds: int = Field(
        default=24 * 3600, ge=1, description="Open sessions expire after this."
    )
    runtime: Literal["local", "ray"] = Field(
        default="local",
        description="Replica backend: `local` worker processes, or `ray` (Ray Serve deployments).",
    )
    ray_address: str | None = Field(
        default=None,
        description="Ray cluster to join with `runtime=ray` (e.g. `ray://head:10001`, `auto`); "
        "unset starts a local Ray instance in the gateway.",
    )
    device: str = Field(
        default="auto", description="`auto` (CUDA when present, else CPU), `cpu`, `cuda`, `cuda:1`..."
    )
    worker_threads: int | None = Field(
        default=None, ge=1, description="torch threads per replica (default: all cores)."
    )
    worker_preload: bool = Field(
        default=True,
        description="Fork replica workers from a template process that imported torch and transformers once "
        "(a cold start then costs only the model's loading); false executes each worker afresh.",
    )
    max_batch_size: int = Field(
        default=64, ge=1, description="Most requests grouped into one model call (inside the replica)."
    )
    max_batch_wait_ms: float = Field(
        default=5.0,
        ge=0,
        description="Right after a batch, how long the next one waits to fill "
        "(an idle replica starts at once).",
    )
    routing_policy: Literal["prefix", "least_busy"] = Field(
        default="prefix",
        description="How a generation's replica is chosen: `prefix`, the one its prompt's prefix belongs to "
        "(within the imbalance below); `least_busy`, the one with the fewest requests in flight, blind to "
        "caches (what modelhost did before; benchmarks compare the two).",
    )
    routing_max_imbalance: int = Field(
        default=2,
        ge=1,
        description="A generation goes to the replica most likely to hold its prompt's prefix in its KV "
        "cache, unless that replica has this many more requests in flight (from this gateway process) than "
        "the least busy one: then to the least busy (docs/runtime.md, Routing).",
    )
    # ---------------------------------------------------------------- autoscaling (docs/runtime.md)
    autoscale_target_in_flight: float = Field(
        default=2.0,
        gt=0,
        description="Requests in flight per replica (held by the replicas for every gateway process), "
        "averaged over the load window, above which a deployment is loaded and the local backend starts "
        "another replica (up to `max_replicas`); Ray Serve's `target_ongoing_requests`.",
    )
    autoscale_ttft_seconds: float = Field(
        default=2.0,
        gt=0,
        description="Time to first token, averaged over the load window (the supervisor's own "
        "generations), above which a deployment is loaded too.",
    )
    autoscale_window_seconds: float = Field(
        default=10.0, gt=0, description="The load window the autoscaler averages over before scaling up."
    )
    autoscale_interval_seconds: float = Field(
        default=1.0, gt=0, description="How often the autoscaler samples each deployment's load."
    )
    scale_down_idle_seconds: float = Field(
        default=120.0,
        gt=0,
        description="A replica beyond `min_replicas` goes once the deployment's load would have fit in one "
        "fewer replica for this long (Ray Serve's `downscale_delay_s`).",
    )
    max_queue_size: int = Field(
        default=1024,
        ge=1,
        description="Requests one gateway process may have in flight per deployment (waiting or running) "
        "before it answers 429.",
    )
    request_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Queue + inference time before 504."
    )
    cold_idle_seconds: float = Field(
        default=300.0, gt=0, description="Idle time after which cold replicas unload."
    )
    load_timeout_seconds: float = Field(
        default=600.0, gt=0, description="Longest a replica may take to load."
    )
    load_retry_seconds: float = Field(default=30.0, ge=0, description="Wait before retrying a failed load.")
    replica_memory_limit_mb: int | None = Field(
        default=None,
        ge=1,
        description="Resident memory (MB, the worker's process tree) above which the supervisor restarts a "
        "local replica; unset: no limit. Ray Serve replicas are left to Ray's own memory monitor.",
    )
    memory_check_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often replicas' memory is measured (their footprints, the limit above, billing).",
    )
    # ---------------------------------------------------------------- capacity (docs/runtime.md)
    memory_budget_mb: int | None = Field(
        default=None,
        ge=1,
        description="Host memory (MiB) that replicas may take together: a load that does not fit evicts "
        "idle deployments or waits. Unset: 80 % of the smaller of the machine's memory and the memory "
        "limit of the server's cgroup, less what the server's own processes hold.",
    )
    gpu_memory_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Of each GPU's memory, what replicas may take together (its budget).",
    )
    min_residency_seconds: float = Field(
        default=30.0,
        ge=0,
        description="A deployment loaded more recently than this is not evicted to make room "
        "(waiting beats thrashing).",
    )
    capacity_wait_seconds: float = Field(
        default=30.0,
        ge=0,
        description="Longest a request waits for memory to load its deployment (first in, first out) "
        "before 503 `insufficient_capacity`.",
    )
    cgroup_root: Path = Field(
        default=Path("/sys/fs/cgroup"),
        description="Where the cgroup filesystem is mounted: the default budget reads the server's memory "
        "limit there (v2, or v1's `memory/` controller).",
    )
    shutdown_drain_seconds: float = Field(
        default=30.0, ge=0, description="In-flight work allowed to finish at stop."
    )
    sweep_interval_seconds: float = Field(
        default=60.0, gt=0, description="How often expired work is cleaned up."
    )
    # Audit rows are kept a year by default (what SOC 2-style reviews ask of access logs); the sweep
    # prunes older ones and keeps the chain verifiable from the last pruned row (modelhost.audit).
    audit_retention_days: float = Field(
        default=365.0,
        ge=0,
        description="Audit rows older than this many days are deleted by the sweep; 0: kept forever.",
    )
    # ---------------------------------------------------------------- HTTP server (docs/operations.md)
    http_header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A request's headers must be complete this long after the connection opened (or, on a "
        "kept-alive connection, after the request's first byte); else 408 and the connection closes.",
    )
    http_body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Longest wait for the next bytes of a request body (idle time between reads, not the "
        "whole body: big uploads may be slow); else 408 and the connection closes.",
    )
    http_keep_alive_seconds: int = Field(
        default=5, ge=1, description="An idle kept-alive connection closes after this."
    )
    http_max_connections: int = Field(
        default=4096,
        ge=1,
        description="Open HTTP connections one gateway process serves; a connection opened beyond them is "
        "answered 503 with Retry-After and closed.",
    )
    # ---------------------------------------------------------------- media inputs (docs/media.md)
    media_root: Path | None = Field(
        default=None,
        description="Local media paths (video `inputs`) are read only below this directory; unset: refused.",
    )
    media_allow_networks: list[str] = Field(
        default_factory=list,
        description="CIDRs that remote media URLs may reach although private/loopback (e.g. 10.0.0.0/8).",
    )
    media_max_bytes: int = Field(
        default=50 * 1024 * 1024, ge=1, description="Largest media file fetched, decoded or read."
    )
    media_fetch_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Longest wait for a remote media file (a request's `timeout` is capped by it).",
    )
    media_max_redirects: int = Field(default=5, ge=0, description="Redirects followed when fetching media.")
    media_max_pixels: int = Field(
        default=40_000_000, ge=1, description="Largest image (width × height) decoded: refuses pixel bombs."
    )
    media_max_seconds: float = Field(default=600.0, gt=0, description="Longest audio or video decoded.")
    # ---------------------------------------------------------------- realtime sessions (docs/realtime.md)
    realtime_max_session_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="A realtime session's longest life; then `session_expired` and close.",
    )
    realtime_max_sessions_per_key: int = Field(
        default=8, ge=1, description="Realtime sessions one key holds open at once, per gateway process."
    )
    realtime_max_events_per_second: float = Field(
        default=100.0,
        gt=0,
        description="Client events per second a realtime session takes (bursts of as many).",
    )
    realtime_max_append_bytes: int = Field(
        default=1024 * 1024,
        ge=1,
        description="Largest audio (decoded bytes) one `input_audio_buffer.append` carries.",
    )
    realtime_max_turn_seconds: float = Field(
        default=120.0, gt=0, description="Longest audio turn a realtime session buffers before its commit."
    )
    realtime_max_items: int = Field(
        default=256,
        ge=2,
        description="Conversation items a realtime session keeps; the oldest are dropped past it.",
    )
    # ---------------------------------------------------------------- generated media
    public_url: str | None = Field(
        default=None,
        description="Base URL clients reach this service at (behind a proxy); default: the request's own. "
        "Single sign-on needs it: its callback is `<public_url>/v1/auth/callback`, and session cookies are "
        "`Secure` when it is https.",
    )
    file_url_secret: SecretStr | None = Field(
        default=None,
        description="Key signing generated-file links; default: one made once and kept in data_dir.",
    )
    generated_file_ttl_seconds: float = Field(
        default=3600.0, gt=0, description="How long generated files (image `url` answers) stay reachable."
    )
    # ---------------------------------------------------------------- video jobs (docs/videos.md)
    video_concurrency: int = Field(default=1, ge=1, description="Video jobs one gateway runs at a time.")
    video_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often an idle server looks for video jobs queued through other servers (a job "
        "queued through this server's gateways is claimed at once).",
    )
    video_job_stale_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A running job silent this long (its gateway died) is re-queued once, then failed.",
    )
    video_retention_seconds: float = Field(
        default=24 * 3600.0, gt=0, description="How long a finished video's content is kept (`expires_at`)."
    )
    video_poll_after_ms: int = Field(
        default=1000, ge=0, description="`openai-poll-after-ms` on a job that is still queued or running."
    )
    # ---------------------------------------------------------------- fine-tuning jobs (docs/fine-tuning.md)
    fine_tuning_concurrency: int = Field(
        default=1, ge=1, description="Fine-tuning jobs the server trains at a time (each a trainer process)."
    )
    fine_tuning_poll_seconds: float = Field(
        default=5.0, gt=0, description="How often an idle server looks for fine-tuning jobs queued elsewhere."
    )
    fine_tuning_stale_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A running job silent this long (its server died) is re-queued and resumes from its "
        "last checkpoint (at most three runs in all).",
    )
    fine_tuning_max_active_per_account: int = Field(
        default=3, ge=1, description="Fine-tuning jobs one account may have queued, running or paused."
    )
    fine_tuning_checkpoints: int = Field(
        default=4, ge=1, description="Checkpoints a job keeps over its steps (the last one at its end)."
    )
    fine_tuning_threads: int = Field(
        default=0, ge=0, description="CPU threads of a trainer on the CPU (0: torch's default)."
    )
    fine_tuning_max_file_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1, description="Largest training or validation file a job accepts."
    )
    # ---------------------------------------------------------------- files and batches (docs/batch.md)
    batch_max_file_bytes: int = Field(
        default=200 * 1024 * 1024,
        ge=1,
        description="Largest batch input file (`POST /v1/files`, purpose batch).",
    )
    batch_completion_window_seconds: float = Field(
        default=24 * 3600.0,
        gt=0,
        description="How long a batch may run (`completion_window: 24h`); lines not answered by then fail "
        "with `batch_expired`. Shorter only for tests.",
    )
    batch_concurrency: int = Field(
        default=4,
        ge=1,
        description="Batches one server runs at a time, of all accounts: several, so that one account's "
        "long batch does not hold every other account's in `validating`.",
    )
    batch_concurrency_per_account: int = Field(
        default=1,
        ge=1,
        description="Batches of one account running at a time on all servers: an account's further "
        "batches wait their turn while other accounts' run (the queue is round-robin between accounts).",
    )
    batch_lines_in_flight: int = Field(
        default=256,
        ge=1,
        description="Lines sent at once by one server, shared evenly between its running batches (each "
        "line at low priority): a few model batches' worth, so that the replica has the next batch "
        "waiting when one ends.",
    )
    batch_max_answer_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Largest answer of one batch line (8 MiB): a larger one is an `answer_too_large` line "
        "in the error file. Bounds what the runner holds per line in flight.",
    )
    batch_max_output_bytes: int = Field(
        default=1024 * 1024 * 1024,
        ge=1024,
        description="Largest output of one batch, its output and error files together (1 GiB): a batch "
        "that would pass it ends `failed` (`batch_output_too_large`) with its answers so far in its "
        "files. Bounds what one batch's answers hold of the database and the disk.",
    )
    batch_recheck_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often a running batch reads its key and account again: a revoked key's lines "
        "fail `invalid_api_key`, and new spend caps apply, within this time.",
    )
    batch_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often an idle server looks for batches created through other servers (a batch "
        "created through this server's gateways is claimed at once).",
    )
    batch_stale_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A running batch whose server has been silent this long (killed) is taken over by "
        "another server, or by the same one restarted.",
    )
    rollout_gate_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often a server's gate runner looks for gated rollouts to drive and judges the "
        'step of each it drives (docs/deploy.md, "Gated rollouts"). A gate whose server has been '
        "silent for `batch_stale_seconds` is taken over.",
    )
    rollout_gate_eval_timeout_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="How long a gated rollout waits for its eval runs; one not ended by then rolls back.",
    )
    # ---------------------------------------------------------------- imports (docs/artifacts.md)
    secrets_key: SecretStr | None = Field(
        default=None,
        description="Fernet key (urlsafe base64 of 32 bytes) sealing what an import keeps while it runs "
        "(its credentials and full source) in the database; default: one made once and kept in "
        "data_dir/secrets.key (mode 0600). Gateways sharing a database must share it.",
    )
    import_concurrency: int = Field(
        default=2, ge=1, description="Imports the server runs at once; the others wait `queued`."
    )
    import_concurrency_per_account: int = Field(
        default=1,
        ge=1,
        description="Imports of one account running at a time on all servers: its further imports wait "
        "`queued` while other accounts' run (the queue is round-robin between accounts).",
    )
    import_min_bytes_per_second: int = Field(
        default=64 * 1024,
        ge=0,
        description="While an import downloads, fewer bytes than this times import_rate_window_seconds "
        "arriving in a window fail it with `source_too_slow` (a trickle holds a slot no longer than "
        "a window); 0 turns the check off.",
    )
    import_rate_window_seconds: float = Field(
        default=60.0, gt=0, description="The window over which import_min_bytes_per_second is measured."
    )
    import_deadline_seconds: float = Field(
        default=24 * 3600.0,
        gt=0,
        description="An import still fetching (listing, downloading, unpacking) this long after its run "
        "began fails with `deadline_exceeded`.",
    )
    import_list_deadline_seconds: float = Field(
        default=300.0,
        gt=0,
        description="Listing an import's source (an S3 prefix's pages, the Hub's file list, probing "
        "https files) longer than this fails it with `source_too_slow`.",
    )
    import_files_in_parallel: int = Field(default=4, ge=1, description="Files one import fetches at once.")
    import_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often an idle server looks for imports queued through other servers (an import "
        "queued through this server's gateways is claimed at once).",
    )
    import_stale_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A running import whose server has been silent this long (killed) is taken over and "
        "resumed by another server, or by the same one restarted.",
    )
    # ---------------------------------------------------------------- agents (docs/agents.md)
    agent_run_stale_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A queued or running agent run silent this long (its gateway died) fails `interrupted`.",
    )
    response_stale_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A background response silent this long (its gateway died) reads as failed "
        "`interrupted`.",
    )
    conversation_max_items: int = Field(
        default=1000,
        ge=1,
        description="Items one conversation may hold (docs/limits.md): adding past it is a 400 "
        "`conversation_full`; a response's turn is refused when its input would not fit.",
    )
    conversation_max_item_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        description="The JSON of one item added to a conversation (its own or a response's input): past it "
        "a 400 `item_too_large`.",
    )
    # ---------------------------------------------------------------- text generation (docs/generation.md)
    vllm_python: str | None = Field(
        default=None,
        description="The Python of an environment with vLLM, which text-generation replicas on the vLLM "
        "engine run under. Unset: the checkout's `.venv-vllm` made by scripts/setup.sh, once its install "
        "finished; empty: vLLM is turned off and every deployment runs on the transformers engine.",
    )
    vllm_tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="GPUs each replica of a vLLM deployment spans (vLLM's tensor parallelism, over its own "
        "worker processes on this machine).",
    )
    encoder_runtimes: bool = Field(
        default=True,
        description="Let encoder deployments (embeddings, classification, reranking, question answering, "
        "fill-mask, image encoders) run on ONNX Runtime or OpenVINO: under `engine: auto` a replica "
        "measures both against torch when it first loads a model on a machine "
        '(docs/runtime.md, "Encoder runtimes"). False: they run on torch, and `onnxruntime` or `openvino` '
        "is a 400.",
    )
    vllm_cache_dir: Path | None = Field(
        default=None,
        description="vLLM's cache (`VLLM_CACHE_ROOT`: its compile cache, and what it learned of each model "
        "class, which it otherwise learns in a process of its own at every start, about 8 s of CPU on the "
        "2-core test machine). Unset: `vllm-cache` in the data folder. Servers may share one: vLLM writes "
        "its entries whole and keys them by what they depend on.",
    )
    vllm_compile: bool = Field(
        default=True,
        description="Run vLLM in its compiled mode (torch.compile; on a GPU, CUDA graphs too): faster "
        "decoding, slower starts (the first start of a model compiles it; later ones read vLLM's compile "
        "cache in the data folder). False: eager mode, the fastest start.",
    )
    llamacpp_slots: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Requests one llamacpp replica (a GGUF deployment) decodes together: llama.cpp's server "
        "slots, each with its own context; more wait for a slot in the replica, interactive requests "
        "before batch lines. Each slot's KV cache is counted in the replica's footprint.",
    )
    llama_server: str | None = Field(
        default=None,
        description="A `llama-server` program (llama.cpp built for this machine's instruction set) that "
        "llamacpp replicas run as their child process. Unset: the checkout's own build "
        "(scripts/build-llama-server.sh, `.venv-llama-server`) once there is one, else the server of the "
        "`xllamacpp` wheel, also as the replica's child; empty: the wheel's always "
        '(docs/engines-llamacpp.md, "The build").',
    )
    llamacpp_context: int = Field(
        default=4096,
        ge=256,
        description="The most tokens of context each slot of a llamacpp replica gets when its deployment "
        "sets no `max_model_len`: the GGUF's own training context is often 32k-128k tokens, whose KV "
        "cache, times the slots, would dwarf a small model's weights.",
    )
    kv_cache_mb: int | None = Field(
        default=None,
        ge=1,
        description="Memory of each text-generation replica's KV cache, allocated once at load and counted "
        "in its footprint; it sets how many sequences run at once (each slot holds the model's whole "
        "context). Unset: room for 64 whole contexts, at most an eighth of the memory budget on a CPU, or "
        "half of what the GPU's budget leaves beside the weights. The supervisor gives each replica its "
        "size in its environment (vLLM's engine included: its own sizing is never used).",
    )
    prefill_chunk_tokens: int | None = Field(
        default=None,
        ge=16,
        description="Most prompt tokens a generation step prefills, so that long prompts do not stall "
        "running streams. Unset: 2048 on CUDA, 256 on CPU. Read by the replica from its environment.",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="Replay decoding steps from CUDA graphs on CUDA (captured in the warm-up). Read by the "
        "replica from its environment.",
    )
    constrained_max_string_length: int = Field(
        default=512,
        ge=1,
        description="Longest string value constrained decoding allows where the schema sets no maxLength.",
    )
    chat_template_seconds: float = Field(
        default=1.0,
        gt=0,
        description="CPU seconds one render of a chat template may take (real templates take "
        "milliseconds); past it the request is a 400 `chat_template_timeout`. Read by the replica from its "
        'environment (docs/operations.md, "Hostile input").',
    )
    chat_template_max_chars: int = Field(
        default=0,
        ge=0,
        description="Most characters a chat template's render may write, or make at once (a list item "
        "counts 8), and a sixteenth of what it may make in all; past it a 400 `chat_template_too_large`. "
        "0 (default): the model's context × its longest token, at least 1,000,000: more than any prompt "
        "that fits the context.",
    )
    # A tenant's grammars, regexes and JSON schemas: bounds checked before anything compiles them, by the
    # gateway and again by the replica (docs/operations.md, "Hostile input"; `generation.grammar_bounds`).
    grammar_max_depth: int = Field(
        default=256,
        ge=8,
        description="Deepest chain a grammar or JSON schema may nest (rules within rules, groups, nested "
        "objects and arrays, $ref hops; a recursive group counts whole). llguidance's compile overflows an "
        "8 MiB stack at about 2,000.",
    )
    grammar_max_rules: int = Field(default=1_000, ge=8, description="Rules of a Lark or GBNF grammar.")
    grammar_max_schema_values: int = Field(
        default=50_000, ge=100, description="Values (objects, arrays, strings, numbers) of a JSON schema."
    )
    grammar_max_repeat: int = Field(
        default=10_000,
        ge=2,
        description="Times a regex or grammar item may repeat, nested counted repetitions ({n,m}) "
        "multiplied.",
    )
    # ... then compiled in child processes of each gateway process, started on first use
    # (`generation.compile_sandbox`): a crash, overrun or timeout there is the request's 400.
    grammar_compile_processes: int = Field(
        default=2, ge=1, le=32, description="Compile processes per gateway process (compiles at once)."
    )
    grammar_compile_cpu_seconds: int = Field(
        default=5, ge=1, description="CPU time one compile may take (its process is killed past it)."
    )
    grammar_compile_memory_mb: int = Field(
        default=1024, ge=256, description="Address space of each compile process (RLIMIT_AS)."
    )
    grammar_compile_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Wall time one compile may take in its compile process."
    )

    # ---------------------------------------------------------------- billing (docs/billing.md)
    billing_compute_credits_per_gb_second: Decimal = Field(
        default=Decimal("0.001"),
        ge=0,
        allow_inf_nan=False,
        description="Credits per GB-second of a loaded replica's resident memory.",
    )
    billing_storage: bool = Field(default=True, description="Bill artifact storage (off: compute only).")
    billing_storage_credits_per_gb_hour: Decimal = Field(
        default=Decimal("0.005"),
        ge=0,
        allow_inf_nan=False,
        description="Credits per GB-hour of stored artifact.",
    )
    billing_min_memory_gb: Decimal = Field(
        default=Decimal(0),
        ge=0,
        allow_inf_nan=False,
        description="Least memory billed per loaded replica (0: bill what it measures).",
    )
    limits_sync_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often a server shares its rate-limit counts with the other servers on its "
        "database: how late each sees the others' use (docs/limits.md).",
    )
    billing_tick_seconds: float = Field(
        default=60.0, gt=0, description="Metering interval: what a crash can lose at most."
    )
    billing_enforce: bool = Field(
        default=True,
        description="Refuse inference and loads (402) at or below zero credits, and unload the replicas.",
    )
    billing_initial_credits: Decimal = Field(
        default=Decimal(100),
        ge=0,
        allow_inf_nan=False,
        description="Credits of an account created without `credits` (a trial grant; 0 for none).",
    )
    billing_balance_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        description="How long a gateway trusts a balance it read (other gateways' top-ups show after it).",
    )
    # ---------------------------------------------------------------- blob storage (docs/deploy.md)
    blob_store: Literal["local", "s3"] = Field(
        default="local",
        description="Where artifacts, generated files and videos are kept: `local` (data_dir/blobs) or "
        "`s3` (a bucket; model files are mirrored into data_dir/blob-cache for the workers).",
    )
    s3_bucket: str | None = Field(default=None, description="The bucket, required when blob_store is s3.")
    s3_endpoint_url: str | None = Field(
        default=None,
        description="Endpoint of an S3-compatible server (MinIO, Ceph, moto); unset means AWS S3 (or "
        "boto3's AWS_ENDPOINT_URL). Credentials: s3_access_key_id / s3_secret_access_key, else "
        "boto3's usual sources: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws, or the "
        "instance role.",
    )
    s3_region: str | None = Field(
        default=None, description="Region of the bucket; unset uses boto3's (AWS_DEFAULT_REGION, ~/.aws)."
    )
    s3_create_bucket: bool = Field(
        default=False,
        description="Make the bucket at start when it does not exist (a local S3-compatible store that "
        "starts empty, as in deploy/compose.yaml); off: the bucket is the operator's to make.",
    )
    s3_key_prefix: str = Field(
        default="", description="Prepended to every object key (e.g. `modelhost/`), to share a bucket."
    )
    # ---------------------------------------------------------------- the operator's credentials
    # (docs/deploy.md, docs/artifacts.md#credentials): the blob store's own keys, and what of the
    # operator's an import may use (nothing, unless named here)
    s3_access_key_id: SecretStr | None = Field(
        default=None,
        description="The blob store's S3 access key (with s3_secret_access_key), best given as a secret "
        "file (MODELHOST_SECRETS_DIR), so that no process's environment holds it; unset: boto3's usual "
        "sources (AWS_* variables, AWS_PROFILE, ~/.aws, the instance or pod role).",
    )
    s3_secret_access_key: SecretStr | None = Field(
        default=None, description="The blob store's S3 secret key, with s3_access_key_id."
    )
    import_operator_credentials_buckets: str = Field(
        default="",
        description="Buckets, comma-separated, that an S3 import without credentials of its own reads with "
        "the operator's AWS credentials (boto3's standard chain, at the operator's endpoint): a bucket of "
        "models every account may have. Any other bucket is read unsigned (public buckets only). The blob "
        "store's own bucket is never imported, whatever this says.",
    )
    import_hub_operator_token_repos: str = Field(
        default="",
        description="Hub repositories, comma-separated shell patterns (`org/name`, `org/*`; `*` for all), "
        "that a Hub import without a token of its own reads with the server's token (HF_TOKEN, or `hf auth "
        "login`'s). Any other repository is read without a token.",
    )

    @model_validator(mode="after")
    def _default_database_url(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{(self.data_dir / 'modelhost.db').as_posix()}"
        return self

    @model_validator(mode="after")
    def _sign_in_is_complete(self) -> Settings:
        if self.oidc_issuer:
            missing = [
                f"MODELHOST_{name.upper()}"
                for name in ("oidc_client_id", "oidc_client_secret", "public_url")
                if not getattr(self, name)
            ]
            if missing:
                raise ValueError(f"MODELHOST_OIDC_ISSUER is set: also set {', '.join(missing)}")
            if "none" in self.oidc_algorithm_list or any(
                a.startswith("HS") for a in self.oidc_algorithm_list
            ):
                raise ValueError("MODELHOST_OIDC_ALGORITHMS: `none` and HMAC algorithms are never accepted")
        return self

    @property
    def oidc_algorithm_list(self) -> list[str]:
        return [a.strip() for a in self.oidc_algorithms.split(",") if a.strip()]

    @model_validator(mode="after")
    def _trusted_proxies_are_addresses(self) -> Settings:
        for entry in self.trusted_proxy_list:
            if entry != "*":
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(
                        f"MODELHOST_TRUSTED_PROXIES: {entry!r} is not an address or a CIDR"
                    ) from None
        return self

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> Settings:
        if self.blob_store == "s3" and not self.s3_bucket:
            raise ValueError("MODELHOST_BLOB_STORE=s3 needs MODELHOST_S3_BUCKET, the bucket to keep blobs in")
        return self

    @model_validator(mode="after")
    def _operator_credentials_are_whole(self) -> Settings:
        if (self.s3_access_key_id is None) != (self.s3_secret_access_key is None):
            raise ValueError(
                "set both MODELHOST_S3_ACCESS_KEY_ID and MODELHOST_S3_SECRET_ACCESS_KEY, or neither"
            )
        if (
            self.blob_store == "s3"
            and self.s3_bucket
            and self.s3_bucket.lower() in self.operator_credentials_buckets
        ):
            raise ValueError(
                "MODELHOST_IMPORT_OPERATOR_CREDENTIALS_BUCKETS names the blob store's own bucket "
                f"({self.s3_bucket}): it is never an import's source"
            )
        return self

    @property
    def operator_credentials_buckets(self) -> frozenset[str]:
        """`import_operator_credentials_buckets` as a set of bucket names (lower case, as S3's are)."""
        names = self.import_operator_credentials_buckets.split(",")
        return frozenset(name.strip().lower() for name in names if name.strip())

    @property
    def hub_operator_token_repos(self) -> list[str]:
        """`import_hub_operator_token_repos` as a list of patterns."""
        return [p.strip() for p in self.import_hub_operator_token_repos.split(",") if p.strip()]

    @property
    def admin_key_value(self) -> str | None:
        return self.admin_key.get_secret_value() if self.admin_key else None

    @property
    def trusted_proxy_list(self) -> list[str]:
        """`trusted_proxies` as a list (empty: none)."""
        return [entry.strip() for entry in self.trusted_proxies.split(",") if entry.strip()]

    @property
    def metrics_key_value(self) -> str | None:
        return self.metrics_key.get_secret_value() if self.metrics_key else None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings read once per process; tests build their own `Settings` instead."""
    return Settings()
