"""How each benchmark's ratios moved since its previous recorded run on the same kind of machine.

    python -m bench.compare [--records docs/benchmarks.jsonl] [--benchmark NAME]

Every benchmark run appends a record to docs/benchmarks.jsonl (`bench.common.record`). For each
benchmark, this takes its newest record and the one before it on the same kind of machine (CPU model,
cores, GPU: records from other hardware are skipped) and prints each ratio of the newest (served / raw,
ours / peer, workers 2 / 1, ...) against the previous one, flagging (`!!`) a change beyond 10 % either
way. Only ratios are compared: measured within one run, on one machine in one state, they hold still
where requests/s and milliseconds move with whatever else the machine does. Even so a ratio moves
between runs (the tables' findings put single runs at a few percent apart), so this warns and never
fails: the exit status is always 0. Each benchmark prints its own comparison right after it records;
`make bench` ends with this module's comparison of every benchmark.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import table

THRESHOLD = 0.10  # a ratio that moved by more than this share of its previous value is flagged
FLAG = "!!"

Record = dict[str, Any]  # one line of the records, as `bench.common.record` writes it


def read_records(path: Path) -> list[Record]:
    """The records in `path`, oldest first; none if there is no file. A line that is not a JSON object
    (a run cut off while writing) is skipped rather than hiding every other record."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and "benchmark" in parsed:
            records.append(parsed)
    return records


def kind(record: Record) -> str | None:
    machine = record.get("machine")
    return machine.get("kind") if isinstance(machine, dict) else None


def latest_pair(records: list[Record], benchmark: str) -> tuple[Record, Record | None] | None:
    """The benchmark's newest record and the previous one on the same kind of machine (None: its first
    there); None if the benchmark has no record."""
    own = [r for r in records if r["benchmark"] == benchmark]
    if not own:
        return None
    newest = own[-1]
    earlier = [r for r in own[:-1] if kind(r) == kind(newest)]
    return newest, (earlier[-1] if earlier else None)


@dataclass(frozen=True)
class Change:
    name: str
    previous: float | None  # None: not a ratio of the previous record
    now: float | None  # None: no longer a ratio of the newest record

    @property
    def change(self) -> float | None:
        """now / previous − 1; None where either is missing or previous is 0."""
        if self.previous is None or self.now is None or self.previous == 0:
            return None
        return self.now / self.previous - 1

    @property
    def flagged(self) -> bool:
        change = self.change
        return change is not None and abs(change) > THRESHOLD + 1e-9  # 1.1 / 1.0 − 1 is 0.1000...09


def ratios(record: Record) -> dict[str, float]:
    figures = record.get("figures", {})
    return {name: figures[name] for name in record.get("ratios", []) if name in figures}


def changes(newest: Record, previous: Record) -> list[Change]:
    """Every ratio of either record: the newest's in its order, then those only the previous had."""
    now, before = ratios(newest), ratios(previous)
    names = [*now, *(name for name in before if name not in now)]
    return [Change(name, before.get(name), now.get(name)) for name in names]


def _run(record: Record) -> str:
    commit = (record.get("commit") or "no commit")[:7]
    return f"{record.get('time', '?')} ({commit}{', dirty' if record.get('dirty') else ''})"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _change(item: Change) -> str:
    change = item.change
    if change is None:
        return "new" if item.previous is None else "gone" if item.now is None else "n/a"
    return f"{change * 100:+.1f} %" + (f" {FLAG}" if item.flagged else "")


def compare(records: list[Record], benchmark: str | None = None) -> str:
    """The comparison of each benchmark (or of `benchmark` only), as text: a table of its ratios (name,
    previous, now, change) and how many moved beyond the threshold."""
    names = list(dict.fromkeys(r["benchmark"] for r in records))
    if benchmark is not None:
        names = [benchmark]
    parts = []
    for name in names:
        found = latest_pair(records, name)
        if found is None:
            parts.append(f"{name}: no record.")
            continue
        newest, previous = found
        if previous is None:
            parts.append(f"{name}: {_run(newest)} is its first record on {kind(newest)}: nothing to compare.")
            continue
        items = changes(newest, previous)
        flagged = sum(item.flagged for item in items)
        rows = [[item.name, _number(item.previous), _number(item.now), _change(item)] for item in items]
        parts.append(
            f"{name}: {_run(newest)} against {_run(previous)} on {kind(newest)}\n"
            f"{table(['ratio', 'previous', 'now', 'change'], rows)}\n"
            f"{flagged} of {len(items)} ratios moved by more than {THRESHOLD * 100:.0f} %"
            f"{f' ({FLAG}): a warning, not a failure' if flagged else ''}."
        )
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=Path, default=Path("docs/benchmarks.jsonl"))
    parser.add_argument("--benchmark", help="one benchmark only (default: every benchmark recorded)")
    args = parser.parse_args()
    records = read_records(args.records)
    print(compare(records, args.benchmark) if records else f"No records in {args.records}.")


if __name__ == "__main__":
    main()
