"""A stream outlives its replica (issue 73): generations moved off a killed replica and off a draining one.

    python -m bench.migration [--streams 16] [--tokens 512]

The text-generation benchmark's random-weight 33 M Llama (`bench.generation.build_model`) on the
transformers engine, deployed with two replicas. `--streams` clients stream at once, half of them plain
greedy answers of exactly `--tokens` tokens, half JSON-schema answers (`response_format`, at most
`--tokens` tokens). Three rounds of the same requests:
- **undisturbed**: the reference texts, and each client's longest pause between two chunks;
- **a replica killed**: once the answers are under way, one replica is SIGKILLed; its generations go on
  on the other replica (or the replacement). Reported: answers complete, texts equal to the
  undisturbed ones, schema answers valid, the longest pause a client saw. Issue 73's target: that
  pause ≤ the new replica's prefill + 1 s. The prefill is measured as the time to first token of the
  same streams all sent at once to an idle deployment (their prompts prefilled together).
- **a rollout's drain**: once the answers are under way, the deployment is moved to another artifact
  (the same files pushed again). Reported: the time from the old version's `draining` to its end, and
  the answers as above. Issue 73's target: the drain within 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jsonschema

from bench.common import Figures, Served, deploy, machine, push_artifact, serve, table, write_section
from bench.generation import build_model

MARKER = "## A stream outlives its replica: generations moved off a killed or draining replica"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "tags"],
}
UNDER_WAY_SECONDS = 1.5  # when the kill or the rollout comes, after the streams were sent


@dataclass
class Answer:
    text: str = ""
    status: int = 0
    first: float = 0.0  # seconds from sending to the first chunk
    longest_pause: float = 0.0  # seconds, the longest between two chunks (or to the first)
    error: str | None = None


@dataclass
class Round:
    answers: list[Answer] = field(default_factory=list)
    drain_seconds: float | None = None
    moved: float = 0.0  # generations that went on elsewhere (`modelhost_generations_migrated_total`)


def _body(index: int, tokens: int) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "chat",
        "messages": [{"role": "user", "content": f"Request {index}: write about the sea."}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    if index % 2:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
    else:
        body["min_tokens"] = tokens
    return body


async def _stream(http: httpx.AsyncClient, key: str, body: dict[str, object]) -> Answer:
    answer = Answer()
    sent = last = time.perf_counter()
    parts: list[str] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        answer.status = response.status_code
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            answer.longest_pause, last = max(answer.longest_pause, now - last), now
            chunk = json.loads(line[6:])
            if "error" in chunk:
                answer.error = chunk["error"].get("code")
                continue
            if chunk.get("choices") and (content := chunk["choices"][0]["delta"].get("content")):
                if not parts:
                    answer.first = now - sent
                parts.append(content)
    answer.text = "".join(parts)
    return answer


def _replica_pids(deployment_id: str) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "modelhost.runtime.worker.sync_worker" in cmdline and deployment_id in cmdline:
            found.append(int(proc.name))
    return found


def _moved(served: Served) -> float:
    """Generations moved so far, every reason (`modelhost_generations_migrated_total`)."""
    lines = httpx.get(f"{served.url}/metrics", timeout=30).text.splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("modelhost_generations_migrated_total{")
    )


def _versions(served: Served, deployment_id: str) -> list[tuple[str, str]]:
    headers = {"Authorization": f"Bearer {served.key}"}
    view = httpx.get(f"{served.url}/v1/deployments/{deployment_id}", headers=headers, timeout=30).json()
    return [(v["artifact_id"], v["state"]) for v in view["versions"]]


async def _roll(served: Served, deployment_id: str, artifact_id: str) -> float:
    """Move the deployment to `artifact_id`; the seconds from its old version's `draining` to its end."""
    headers = {"Authorization": f"Bearer {served.key}"}
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as http:
        patched = await http.patch(f"/v1/deployments/{deployment_id}", json={"artifact_id": artifact_id})
        patched.raise_for_status()
        draining_at = None
        deadline = time.perf_counter() + 300
        while time.perf_counter() < deadline:
            versions = await asyncio.to_thread(_versions, served, deployment_id)
            if draining_at is None and any(state == "draining" for _, state in versions):
                draining_at = time.perf_counter()
            if versions == [(artifact_id, "active")]:
                return time.perf_counter() - (draining_at or time.perf_counter())
            await asyncio.sleep(0.05)
    raise TimeoutError("the rollout did not end within 300 s")


async def _round(
    served: Served, deployment_id: str, streams: int, tokens: int, disturb: str | None, new_artifact: str
) -> Round:
    found = Round()
    moved = await asyncio.to_thread(_moved, served)
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=served.url, timeout=600, limits=limits) as http:
        tasks = [asyncio.create_task(_stream(http, served.key, _body(i, tokens))) for i in range(streams)]
        if disturb is not None:
            await asyncio.sleep(UNDER_WAY_SECONDS)
            if disturb == "kill":
                os.kill(_replica_pids(deployment_id)[0], signal.SIGKILL)
            else:
                found.drain_seconds = await _roll(served, deployment_id, new_artifact)
        found.answers = list(await asyncio.gather(*tasks))
    found.moved = await asyncio.to_thread(_moved, served) - moved
    return found


def _deployment_id(served: Served) -> str:
    headers = {"Authorization": f"Bearer {served.key}"}
    listed = httpx.get(f"{served.url}/v1/deployments", headers=headers, timeout=30).json()["data"]
    return str(listed[0]["id"])


def _valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--port", type=int, default=8397)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    model = Path(tempfile.mkdtemp(prefix="mh-bench-migration-")) / "chat"
    build_model(model)
    served = serve(args.port)
    try:
        deploy(
            served, model, "text-generation", "chat", engine="transformers", min_replicas=2, max_replicas=2
        )
        deployment_id = _deployment_id(served)
        other = push_artifact(served, model, "chat-again", "text-generation")
        asyncio.run(_round(served, deployment_id, args.streams, 8, None, other))  # warm-up
        rounds = {
            name: asyncio.run(_round(served, deployment_id, args.streams, args.tokens, disturb, other))
            for name, disturb in (("undisturbed", None), ("a replica killed", "kill"), ("a rollout", "roll"))
        }
    finally:
        served.stop()
    reference = rounds["undisturbed"].answers
    prefill = max(a.first for a in reference)  # every stream's prompt prefilled at once: the last first token
    figures = Figures("migration")
    rows = []
    for name, found in rounds.items():
        answers = found.answers
        complete = sum(a.status == 200 and a.error is None for a in answers)
        equal = sum(a.text == r.text for a, r in zip(answers, reference, strict=True))
        schema = [a for i, a in enumerate(answers) if i % 2]
        valid = sum(_valid(a.text) for a in schema)
        pause = max(a.longest_pause for a in answers)
        slug = name.replace(" ", "_")
        figures.add(f"{slug}.complete", complete)
        figures.add(f"{slug}.moved", found.moved)
        figures.add(f"{slug}.longest_pause_s", pause)
        if name != "undisturbed":
            figures.ratio(f"{slug}.pause_over_prefill", pause / prefill)
        if found.drain_seconds is not None:
            figures.add(f"{slug}.drain_s", found.drain_seconds)
        rows.append(
            [
                name,
                f"{found.moved:.0f}",
                f"{complete}/{len(answers)}",
                f"{equal}/{len(answers)}",
                f"{valid}/{len(schema)}",
                f"{pause:.2f}",
                "-" if found.drain_seconds is None else f"{found.drain_seconds:.2f}",
            ]
        )
    header = [
        "round",
        "streams moved",
        "complete",
        "text = undisturbed",
        "schema answers valid",
        "longest pause a client saw, s",
        "old version's drain, s",
    ]
    section = f"""{MARKER}

`python -m bench.migration --streams {args.streams} --tokens {args.tokens}` ({machine()}): the 33 M Llama on
the transformers engine, two replicas; {args.streams} streams at once, half greedy answers of {args.tokens}
tokens, half JSON-schema answers; a replica SIGKILLed, then a rollout, {UNDER_WAY_SECONDS:g} s after the
streams were sent (bench/migration.py says more). The new replica's prefill, for the target: the last
first token of the undisturbed round, {prefill:.2f} s (all {args.streams} prompts prefilled at once). Targets
(issue 73): every answer complete, greedy texts equal, schema answers valid, the longest pause ≤ that
prefill + 1 s, the drain within 5 s.

{table(header, rows)}
"""
    write_section(args.out, MARKER, section, figures)
    print(section)


if __name__ == "__main__":
    main()
