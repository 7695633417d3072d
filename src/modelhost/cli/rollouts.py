"""A gated rollout from the command line (docs/deploy.md, "Gated rollouts"): the `--gate-*` options of
`deployments update` as the API's `gate` object, and the rollout's steps and decisions as text."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from modelhost.cli.output import out

GateEval = Annotated[
    str | None,
    typer.Option(
        help="Gate the rollout of --artifact on this eval (eval_...): both versions run it, the new one is "
        "promoted step by step while it holds, else rolled back.",
        show_default=False,
    ),
]
GateSteps = Annotated[
    str | None, typer.Option(help="The new version's percents, e.g. 10,50,100 (default).", show_default=False)
]
GateMargin = Annotated[
    float | None,
    typer.Option(
        help="How far below the current version's score the new one may be (0).", show_default=False
    ),
]
GateStepSeconds = Annotated[
    float | None, typer.Option(help="How long each step runs before it is judged (60).", show_default=False)
]
GateMinRequests = Annotated[
    int | None, typer.Option(help="Requests a step needs before it is judged (0).", show_default=False)
]
GateMaxErrorRate = Annotated[
    float | None, typer.Option(help="The new version's 5xx share over a step (0.05).", show_default=False)
]
GateMaxTtft = Annotated[
    float | None,
    typer.Option(help="The new version's TTFT p50 over a step, in ms (not judged).", show_default=False),
]


def gate_body(
    eval_id: str | None,
    steps: str | None,
    margin: float | None,
    step_seconds: float | None,
    min_requests: int | None,
    max_error_rate: float | None,
    max_ttft_p50_ms: float | None,
) -> dict[str, Any] | None:
    """The API's `gate` (None without --gate-eval; another --gate-* option alone is refused)."""
    given = {
        "margin": margin,
        "step_seconds": step_seconds,
        "min_requests": min_requests,
        "max_error_rate": max_error_rate,
        "max_ttft_p50_ms": max_ttft_p50_ms,
    }
    if eval_id is None:
        if steps is not None or any(v is not None for v in given.values()):
            raise typer.BadParameter("the --gate-* options need --gate-eval", param_hint="--gate-eval")
        return None
    gate: dict[str, Any] = {"eval_id": eval_id, **{k: v for k, v in given.items() if v is not None}}
    if steps is not None:
        try:
            gate["steps"] = [int(step) for step in steps.split(",")]
        except ValueError:
            raise typer.BadParameter(
                f"{steps!r} is not PERCENT,PERCENT,...", param_hint="--gate-steps"
            ) from None
    return gate


def show_rollout(rollout: dict[str, Any] | None) -> None:
    """The gated rollout's state, its steps (the one under way marked) and every decision with its reason
    and figures, as plain text (reasons may quote the model's output: never read as markup)."""
    if not rollout:
        return
    gate = rollout["gate"]
    step = rollout.get("step")
    steps = " → ".join(
        f"[{percent} %]" if index == step else f"{percent} %" for index, percent in enumerate(gate["steps"])
    )
    lines = [
        f"gated rollout of {rollout['candidate']} (from {rollout['current']}): {rollout['state']}",
        f"  eval {gate['eval_id']}, margin {gate['margin']}, steps {steps}, {gate['step_seconds']} s each",
    ]
    runs = rollout.get("eval_runs") or {}
    if runs:
        lines.append("  eval runs: " + ", ".join(f"{which} {run}" for which, run in runs.items()))
    for entry in rollout.get("decisions") or []:
        at = "" if entry.get("step") is None else f" (step {entry['step']})"
        lines.append(f"  {entry['at']} {entry['decision']}{at}: {entry['reason']}")
        if entry.get("scores"):
            scores = entry["scores"]
            lines.append(f"    scores: candidate {scores['candidate']}, current {scores['current']}")
        if entry.get("metrics"):
            lines.append("    metrics: " + ", ".join(f"{k} {v}" for k, v in entry["metrics"].items()))
        if entry.get("traffic"):
            lines.append("    traffic: " + ", ".join(f"{a} {p} %" for a, p in entry["traffic"].items()))
    for line in lines:
        out.print(line, soft_wrap=True, markup=False, highlight=False)
