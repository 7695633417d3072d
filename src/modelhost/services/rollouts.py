"""A deployment's versions and how a rollout moves between them (docs/deploy.md, "Rollouts"): pure
functions from one table of versions to the next, which `services.deployments` stores and the runtime
acts on (a `loading` version loads beside the others, a `draining` one finishes its requests and unloads).

One rule holds the "no failed request" promise: a version leaving the split (traffic 0) stays `active`,
and takes the share of the versions not ready yet, until every version that takes traffic is `active`;
only then does it drain (`settle`). A load that fails leaves it serving. `replace` drains it at once
instead (its memory is needed), and requests wait for the new version's load.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from modelhost.routing import Version

# A deployment's history keeps its last switches only
HISTORY_LENGTH = 20


def stored(versions: Sequence[Version]) -> list[dict[str, Any]]:
    """The table as the deployment's row keeps it."""
    return [
        {
            "artifact_id": v.artifact_id,
            "traffic": v.traffic,
            "state": v.state,
            "since": v.since,
            "reason": v.reason,
        }
        for v in versions
    ]


def read(rows: Sequence[Mapping[str, Any]] | None, artifact_id: str, since: str) -> list[Version]:
    """The table a row keeps; a deployment that never rolled out has one version, its artifact."""
    if not rows:
        return [Version(artifact_id, 100, "active", since)]
    return [Version(**row) for row in rows]


def plan(
    versions: Sequence[Version],
    traffic: Mapping[str, int],
    now: str,
    *,
    loaded: bool,
    replacing: bool,
    keep: Collection[str] = (),
) -> list[Version]:
    """The table once a PATCH asks for `traffic` (artifact → percent). Not `loaded` (nothing runs): the
    versions are simply the ones asked for. Otherwise an artifact new to the table loads beside the others,
    one that failed loads again, one draining (still loaded) takes requests again at once (a rollback), one
    loading but no longer asked for is dropped (its load stops), and one active but no longer asked for
    keeps serving until the others are ready (`settle`), or drains now when `replacing`. `keep`: a gated
    rollout's candidate, held loaded at 0 % while its gate decides (`services.gates`)."""
    if not loaded:
        return [Version(a, percent, "active", now) for a, percent in traffic.items()]
    table: list[Version] = []
    for version in versions:
        percent = traffic.get(version.artifact_id)
        if percent is not None:
            state = "loading" if version.state == "failed" else version.state
            state = "active" if state == "draining" else state
            changed = state != version.state
            table.append(
                replace(
                    version,
                    traffic=percent,
                    state=state,
                    since=now if changed else version.since,
                    reason=None,
                )
            )
        elif version.state == "active":
            state = "draining" if replacing else "active"
            table.append(replace(version, traffic=0, state=state, since=now if replacing else version.since))
        elif version.state == "draining":
            table.append(version)
    known = {v.artifact_id for v in versions}
    table += [Version(a, percent, "loading", now) for a, percent in traffic.items() if a not in known]
    return settle(table, now, keep)


def settle(versions: Sequence[Version], now: str, keep: Collection[str] = ()) -> list[Version]:
    """Once every version that takes traffic is active, the ones leaving (active, traffic 0) drain, but
    those kept (a gated rollout's candidate at 0 %)."""
    if any(v.traffic > 0 and v.state != "active" for v in versions):
        return list(versions)
    return [
        replace(v, state="draining", since=now)
        if v.state == "active" and v.traffic == 0 and v.artifact_id not in keep
        else v
        for v in versions
    ]


def loaded(
    versions: Sequence[Version], artifact_id: str, now: str, keep: Collection[str] = ()
) -> list[Version]:
    """The version finished loading: it takes its traffic, and the leaving ones may drain."""
    table = [
        replace(v, state="active", since=now, reason=None)
        if v.artifact_id == artifact_id and v.state == "loading"
        else v
        for v in versions
    ]
    return settle(table, now, keep)


def failed(versions: Sequence[Version], artifact_id: str, reason: str, now: str) -> list[Version]:
    """Its load failed: it takes no requests (the leaving version keeps them) and says why."""
    return [
        replace(v, state="failed", since=now, reason=reason)
        if v.artifact_id == artifact_id and v.state == "loading"
        else v
        for v in versions
    ]


def drained(versions: Sequence[Version], artifact_id: str) -> list[Version]:
    """It finished its requests and unloaded: it leaves the table."""
    return [v for v in versions if not (v.artifact_id == artifact_id and v.state == "draining")]


def primary(versions: Sequence[Version]) -> str:
    """The artifact the deployment shows as its own (`artifact_id`): the one asked to take the most
    traffic (the first of equals)."""
    return max(versions, key=lambda v: v.traffic).artifact_id


def split(versions: Sequence[Version]) -> dict[str, int]:
    """The traffic asked for, artifact → percent (versions leaving left out)."""
    return {v.artifact_id: v.traffic for v in versions if v.traffic > 0}


def held(versions: Sequence[Version]) -> set[str]:
    """The artifacts the deployment holds (each counts one use in its artifact's `deployment_count`, so
    it cannot be deleted or filled again while a version of it may run)."""
    return {v.artifact_id for v in versions}
