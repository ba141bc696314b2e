"""Where an acquisition run's wall time went: the phase table of one or more runs (issue 19).

    PYTHONPATH=. python3 bench/acquisition_phases.py RUN.jsonl [RUN2.jsonl ...] \
        [--label before --label after] [--per-target]

Each file is what ``python -m acquisition ... --phase-log FILE`` appended (one JSON record per
run; several records in one file are summed, e.g. a run and its resume). Prints a Markdown
table: seconds per phase for each run side by side, the share of the wall time, and the
points measured per minute from the process's start to the published bundle.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from acquisition.phases import PHASES


@dataclass
class Run:
    label: str
    wall_s: float = 0.0
    points: int = 0
    points_total: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    targets: dict[str, dict[str, float]] = field(default_factory=dict)
    target_points: dict[str, int] = field(default_factory=dict)
    exit_status: list[int] = field(default_factory=list)

    @property
    def points_per_minute(self) -> float:
        return self.points / self.wall_s * 60.0 if self.wall_s > 0 else 0.0


def load(path: Path, label: str) -> Run:
    run = Run(label)
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("type") != "phases":
            raise SystemExit(f"{path}:{number}: not a phase record")
        run.wall_s += float(record["wall_s"])
        run.points_total = max(run.points_total, int(record.get("points_total") or 0))
        status = record.get("exit_status")
        run.exit_status.append(-1 if status is None else int(status))
        for target, entry in record["targets"].items():
            per_target = run.targets.setdefault(target, {})
            for phase, seconds in entry["seconds"].items():
                run.seconds[phase] = run.seconds.get(phase, 0.0) + float(seconds)
                per_target[phase] = per_target.get(phase, 0.0) + float(seconds)
            for phase, count in entry.get("counts", {}).items():
                run.counts[phase] = run.counts.get(phase, 0) + int(count)
            run.points += int(entry.get("points", 0))
            run.target_points[target] = run.target_points.get(target, 0) + int(
                entry.get("points", 0)
            )
    return run


def table(runs: list[Run]) -> str:
    head = "| phase | " + " | ".join(f"{r.label} s | share" for r in runs) + " |"
    rule = "| --- | " + " | ".join("---: | ---:" for _ in runs) + " |"
    lines = [head, rule]
    names = [p for p in PHASES if any(r.seconds.get(p, 0) > 0 for r in runs)]
    for phase in names:
        cells = []
        for r in runs:
            seconds = r.seconds.get(phase, 0.0)
            share = seconds / r.wall_s * 100 if r.wall_s else 0.0
            cells.append(f"{seconds:.2f} | {share:.1f} %")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    lines.append(
        "| **wall (process start to bundle)** | "
        + " | ".join(f"**{r.wall_s:.1f}** | 100 %" for r in runs)
        + " |"
    )
    lines.append("| points measured | " + " | ".join(f"{r.points} | " for r in runs) + " |")
    lines.append(
        "| **points per minute** | "
        + " | ".join(f"**{r.points_per_minute:.0f}** | " for r in runs)
        + " |"
    )
    return "\n".join(lines)


def per_target(run: Run) -> str:
    lines = [
        f"{run.label}:",
        "",
        "| target | points | seconds | top phases |",
        "| --- | ---: | ---: | --- |",
    ]
    for target, seconds in run.targets.items():
        total = sum(seconds.values())
        top = sorted(seconds.items(), key=lambda kv: -kv[1])[:4]
        text = ", ".join(f"{k} {v:.1f}" for k, v in top)
        lines.append(f"| {target} | {run.target_points.get(target, 0)} | {total:.1f} | {text} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--label", action="append", default=None)
    parser.add_argument("--per-target", action="store_true")
    args = parser.parse_args(argv)
    labels = args.label or [f.stem for f in args.files]
    if len(labels) != len(args.files):
        parser.error("give one --label per file")
    runs = [load(f, label) for f, label in zip(args.files, labels, strict=True)]
    print(table(runs))
    if args.per_target:
        for run in runs:
            print()
            print(per_target(run))
    for run in runs:
        if any(status != 0 for status in run.exit_status):
            print(f"\n{run.label}: exit status {run.exit_status} (not every run published)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
