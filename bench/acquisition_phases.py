"""Where an acquisition run's wall time went: the phase table of one or more runs (issue 19).

    PYTHONPATH=. python3 bench/acquisition_phases.py RUN.jsonl [RUN2.jsonl ...] \
        [--label before --label after] [--per-target]

Each file is what ``python -m acquisition ... --phase-log FILE`` appended (one JSON record per
run; several records in one file are summed, e.g. a run and its resume). Prints a Markdown
table: seconds per phase for each run side by side, the share of the wall time, and the
points measured per minute from the process's start to the published bundle.

With ``--isolate-targets`` a command writes one record per child (its command line holds
``--only-target KEY``) and then the parent's, whose ``isolated_target`` seconds contain the
children's whole walls. Such a group counts once: the parent's wall, the children's phases, and
as ``isolated_target`` only what the children's own records do not hold (spawning them,
relaying their progress).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acquisition.phases import PHASES

START_PHASES = frozenset({"process_start", "plan", "runtime_probe", "admission", "isolated_target"})


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
    # What each target's Triton precompilation did (the record's notes.precompile).
    precompiled: list[str] = field(default_factory=list)
    # Each target's measuring loop: the cyclic collector (notes.gc) and vLLM workspace
    # requests made and spared (notes.workspace_views, vllm-modular).
    loop_notes: list[str] = field(default_factory=list)

    @property
    def points_per_minute(self) -> float:
        return self.points / self.wall_s * 60.0 if self.wall_s > 0 else 0.0

    @property
    def measuring_points_per_minute(self) -> float:
        """Points a minute once started: without the once-per-process and per-target start
        (interpreter, torch, vLLM import, builds, child spawning), which a cold machine's
        caches sway by seconds between two runs of the same code."""
        start = sum(
            v for k, v in self.seconds.items() if k in START_PHASES or k.startswith("build")
        )
        measuring = self.wall_s - start
        return self.points / measuring * 60.0 if measuring > 0 else 0.0


def _child_target(record: dict[str, Any]) -> str | None:
    """The target an isolated child measured (None for a parent or a plain run)."""
    words = str(record.get("command_line") or "").split()
    if "--only-target" in words:
        index = words.index("--only-target") + 1
        return words[index] if index < len(words) else ""
    return None


def _fold(parent: dict[str, Any], children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A parent's record with its children's walls taken out of its ``isolated_target``."""
    targets = {key: {**entry, "seconds": dict(entry["seconds"])}
               for key, entry in parent["targets"].items()}  # fmt: skip
    for child in children:
        entry = targets.get(_child_target(child) or "")
        if entry is not None and "isolated_target" in entry["seconds"]:
            left = float(entry["seconds"]["isolated_target"]) - float(child["wall_s"])
            entry["seconds"]["isolated_target"] = max(0.0, left)
    children_only = [{**child, "wall_s": 0.0, "exit_status": None} for child in children]
    return [*children_only, {**parent, "targets": targets}]


def _grouped(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with each isolated command's children folded into its parent's."""
    out: list[dict[str, Any]] = []
    children: list[dict[str, Any]] = []
    for record in records:
        if _child_target(record) is not None:
            children.append(record)
            continue
        isolated = any(
            "isolated_target" in entry["seconds"] for entry in record["targets"].values()
        )
        if children and isolated:
            out.extend(_fold(record, children))
        else:
            out.extend([*children, record])
        children = []
    return out + children  # children of a parent killed before writing its record


def load(path: Path, label: str) -> Run:
    run = Run(label)
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("type") != "phases":
            raise SystemExit(f"{path}:{number}: not a phase record")
        records.append(record)
    for record in _grouped(records):
        run.wall_s += float(record["wall_s"])
        run.points_total = max(run.points_total, int(record.get("points_total") or 0))
        status = record.get("exit_status")
        if record["wall_s"] or status is not None:
            run.exit_status.append(-1 if status is None else int(status))
        for target, entry in record["targets"].items():
            per_target = run.targets.setdefault(target, {})
            for phase, seconds in entry["seconds"].items():
                run.seconds[phase] = run.seconds.get(phase, 0.0) + float(seconds)
                per_target[phase] = per_target.get(phase, 0.0) + float(seconds)
            for phase, count in entry.get("counts", {}).items():
                run.counts[phase] = run.counts.get(phase, 0) + int(count)
            note = entry.get("notes", {}).get("precompile")
            if isinstance(note, dict):
                run.precompiled.append(
                    f"{target}: {note.get('mode')}, {note.get('workers')} workers, "
                    f"{note.get('rows')} row counts, {note.get('configs')} configurations, "
                    f"{note.get('compiled')} kernels compiled, {float(note.get('seconds', 0)):.1f} s"
                    + (f" ({'; '.join(note['fallback'])})" if note.get("fallback") else "")
                )
            heap = entry.get("notes", {}).get("gc")
            if isinstance(heap, dict):
                views = entry.get("notes", {}).get("workspace_views") or {}
                run.loop_notes.append(
                    f"{target}: {heap.get('frozen_objects')} objects frozen, "
                    f"{heap.get('objects_after')} new ones alive at the end, collections "
                    f"{heap.get('collections')} in {float(heap.get('seconds', 0)):.2f} s"
                    + (
                        f"; vLLM workspace requests {views.get('requested')}, spared "
                        f"{views.get('reused')}"
                        if views
                        else ""
                    )
                )
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
    lines.append(
        "| points per minute once started (no start, import, build) | "
        + " | ".join(f"{r.measuring_points_per_minute:.0f} | " for r in runs)
        + " |"
    )
    return "\n".join(lines)


def precompile_notes(runs: list[Run]) -> str:
    """One line per precompiled target (nothing for runs without precompilation)."""
    lines = [f"- {run.label} {line}" for run in runs for line in run.precompiled]
    return "\n".join(["Triton precompilation:", *lines]) if lines else ""


def loop_notes(runs: list[Run]) -> str:
    """One line per measured target: the collector and the workspace requests in its loop."""
    lines = [f"- {run.label} {line}" for run in runs for line in run.loop_notes]
    return "\n".join(["Measuring loops:", *lines]) if lines else ""


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
    if notes := precompile_notes(runs):
        print()
        print(notes)
    if notes := loop_notes(runs):
        print()
        print(notes)
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
