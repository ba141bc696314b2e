"""Per point: how many forwards an acquisition issued, why, and how long the GPU was busy (issue 19).

    PYTHONPATH=. python3 bench/acquisition_forward_budget.py SAMPLES_ROOT [--phases PHASES.jsonl]
        [--goal 1000] [--fixed-s SECONDS]

SAMPLES_ROOT is an acquisition's out root (or any folder above its ``_acquisition`` tree, e.g.
an unpacked ``bf16.acquisition-samples.tar.gz``): every ``samples.jsonl`` under it is one
target's checkpoint. From the checkpoint alone it counts, per target, the forwards the
protocol issued and why:

- ``reference``: the reference check, two forwards per weight set (the bank's forward and the
  cloned eager reference's), once per point and run (R19);
- ``warmup``: per context, ``warmup_cycles`` whole cycles of the 2B arm's 2B sets, the same
  count in both arms (R18); ``local_warmup`` for the local components;
- ``timed``: per context the recorded forwards (at least ``iterations``, whole 2B cycles, R16,
  R18), of every attempt (a point whose B/2B check failed is measured again: ``retry``);

and the device time those forwards kept the GPU busy: the recorded (attributed) time of every
timed forward, and for warmup and reference forwards their context's median (estimated: those
forwards are not timed; a reference forward runs the same kernels on other weights).

With ``--phases`` (the run's ``--phase-log``; several records are summed, targets matched by
their label) it divides each phase's seconds by the forwards it ran: host milliseconds per
warmup, timed and reference forward, the profiler's cost per timed forward, and the share of
the measuring wall during which the GPU was busy. ``--goal`` prints what a whole-run rate of
that many points a minute leaves per forward once the fixed start (``--fixed-s``, default: the
record's process start, torch probe, vLLM import and builds) is paid.

The samples and the phases may come from different runs of one plan (the counts are a pure
function of the plan, B per point and the retries); say so when quoting the result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Phases booked per forward kind, and the profiler's own phases (issue 19's phase clock).
PROFILER_PHASES = (
    "profiler_start",
    "profiler_toggle",
    "profiler_stop",
    "trace_collection",
    "attribution",
)
FIXED_PHASES = ("process_start", "plan", "runtime_probe", "admission")
# A parent's seconds around its isolated children (their own records hold their phases).
WRAPPER_PHASES = ("isolated_target",)
KINDS = ("reference", "warmup", "timed")


@dataclass
class Budget:
    """One target's forwards (by kind) and the device time they kept the GPU busy."""

    target: str
    points: int = 0
    expert_points: int = 0
    attempts: int = 0
    b_sets: list[int] = field(default_factory=list)
    forwards: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    device_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    retry_forwards: int = 0
    # Wall ms per warmup + timed forward in each fifth of the first session's contexts (from
    # the checkpoint's write stamps): whether the loop slows down as a target goes on.
    fifths_ms: list[float] = field(default_factory=list)

    @property
    def total_forwards(self) -> int:
        return sum(self.forwards.values())

    @property
    def total_device_s(self) -> float:
        return sum(self.device_s.values())


def _target_label(path: Path) -> str:
    """``tp1/dp1_ep1_rank0_sp0`` from ``.../tp1/moe_components/dp1_ep1_rank0_sp0/samples.jsonl``
    (the label the phase log uses)."""
    parts = path.parent.parts
    return f"{parts[-3]}/{parts[-1]}" if len(parts) >= 3 else path.parent.name


def budget(path: Path) -> Budget:
    """Forwards and device seconds of one target's ``samples.jsonl``."""
    protocol: dict[str, Any] = {}
    slots: dict[str, int] = defaultdict(int)
    times: dict[tuple[str, int, str, int], list[float]] = defaultdict(list)
    contexts: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        kind = record.get("type")
        if "identity" in record:
            protocol = record["identity"].get("protocol", protocol)
        elif kind == "reference_check":
            slots[record["point"]] += int(record["slots"])
        elif kind == "forward":
            key = (record["point"], int(record["attempt"]), record["arm"], int(record["round"]))
            times[key].append(float(record["time_us"]))
        elif kind == "context":
            contexts.append(record)
    warmup_cycles = int(protocol.get("warmup_cycles", 1))
    local_warmup = int(protocol.get("local_warmup", 2))
    found = Budget(_target_label(path))
    points: dict[str, list[float]] = defaultdict(list)
    attempts: set[tuple[str, int]] = set()
    b_of: dict[str, int] = {}
    for context in contexts:
        point, attempt = context["point"], int(context["attempt"])
        key = (point, attempt, context["arm"], int(context["round"]))
        recorded = times.get(key, [])
        median = statistics.median(recorded) if recorded else 0.0
        if context["arm"] == "local":
            warmup = local_warmup
        else:
            b = int(context["sets"]) if context["arm"] == "B" else int(context["sets"]) // 2
            b_of[point] = b
            warmup = warmup_cycles * 2 * b
        found.forwards["timed"] += len(recorded)
        found.device_s["timed"] += sum(recorded) / 1e6
        found.forwards["warmup"] += warmup
        found.device_s["warmup"] += warmup * median / 1e6
        if attempt > 0:
            found.retry_forwards += len(recorded) + warmup
        points[point].extend(recorded)
        attempts.add((point, attempt))
    found.fifths_ms = _fifths(contexts, warmup_cycles, local_warmup)
    for point, sets in slots.items():
        recorded = points.get(point, [])
        median = statistics.median(recorded) if recorded else 0.0
        found.forwards["reference"] += 2 * sets
        found.device_s["reference"] += 2 * sets * median / 1e6
    found.points = len(points)
    found.expert_points = len(b_of)
    found.b_sets = sorted(b_of.values())
    found.attempts = len(attempts)
    return found


def _fifths(contexts: list[dict[str, Any]], warmup_cycles: int, local_warmup: int) -> list[float]:
    """Wall ms per (warmup + timed) forward over five equal runs of the first session's
    contexts, in checkpoint order. A context's ``at`` is when its batch was written, so each
    fifth's wall runs from the previous fifth's last stamp to its own (the first from its
    first stamp: one batch less). Reference forwards are not counted (their seconds are)."""
    first = [c for c in contexts if "at" in c and c.get("session") == contexts[0].get("session")]
    if len(first) < 10:
        return []
    out = []
    bounds = [len(first) * k // 5 for k in range(6)]
    for k in range(5):
        part = first[bounds[k] : bounds[k + 1]]
        since = float(first[bounds[k] - 1]["at"]) if k else float(part[0]["at"])
        forwards = 0
        for c in part:
            if c["arm"] == "local":
                forwards += local_warmup + int(c["forwards"])
            else:
                b = int(c["sets"]) if c["arm"] == "B" else int(c["sets"]) // 2
                forwards += warmup_cycles * 2 * b + int(c["forwards"])
        wall = float(part[-1]["at"]) - since
        out.append(wall / forwards * 1e3 if forwards else 0.0)
    return out


def load_phases(path: Path) -> tuple[dict[str, dict[str, float]], float]:
    """Seconds per phase per target, summed over the file's records, and the summed wall."""
    seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    wall = 0.0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("type") != "phases":
            continue
        # An isolated child's own record carries --only-target; its parent's wall holds it.
        if "--only-target" not in str(record.get("command_line") or "").split():
            wall += float(record.get("wall_s") or 0.0)
        for target, entry in record.get("targets", {}).items():
            for phase, value in entry.get("seconds", {}).items():
                seconds[target][phase] += float(value)
    return {k: dict(v) for k, v in seconds.items()}, wall


def _per(seconds: float, count: int) -> str:
    return f"{seconds / count * 1e3:.3f}" if count else "-"


def report(
    budgets: list[Budget],
    phases: dict[str, dict[str, float]] | None,
    wall: float,
    goal: float | None,
    fixed_s: float | None,
) -> str:
    lines = [
        "| target | points (expert) | mean B | reference fw | warmup fw | timed fw | of them "
        "retries | forwards a point | GPU busy s (timed + est. warmup, reference) | "
        "wall ms a forward by fifth (first session) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for b in budgets:
        mean_b = statistics.fmean(b.b_sets) if b.b_sets else 0.0
        lines.append(
            f"| {b.target} | {b.points} ({b.expert_points}) | {mean_b:.2f} | "
            f"{b.forwards['reference']:,} | {b.forwards['warmup']:,} | {b.forwards['timed']:,} | "
            f"{b.retry_forwards:,} | {b.total_forwards / max(b.points, 1):.1f} | "
            f"{b.total_device_s:.2f} | {' '.join(f'{v:.2f}' for v in b.fifths_ms) or '-'} |"
        )
    points = sum(b.points for b in budgets)
    forwards = sum(b.total_forwards for b in budgets)
    device = sum(b.total_device_s for b in budgets)
    lines.append(
        f"| **all** | {points} | | {sum(b.forwards['reference'] for b in budgets):,} | "
        f"{sum(b.forwards['warmup'] for b in budgets):,} | "
        f"{sum(b.forwards['timed'] for b in budgets):,} | "
        f"{sum(b.retry_forwards for b in budgets):,} | {forwards / max(points, 1):.1f} | "
        f"{device:.2f} | |"
    )
    if phases is None:
        return "\n".join(lines)
    lines += [
        "",
        "| target | measuring s | GPU busy share | ms a reference fw | ms a warmup fw | "
        "ms a timed fw | profiler ms a timed fw | other measuring ms a point |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    fixed_total = 0.0
    for seconds in phases.values():
        fixed_total += sum(
            v for k, v in seconds.items() if k in FIXED_PHASES or k.startswith("build")
        )
    for b in budgets:
        seconds = phases.get(b.target, {})
        measuring = sum(
            v
            for k, v in seconds.items()
            if k not in FIXED_PHASES + WRAPPER_PHASES
            and not k.startswith("build")
            and k != "publish"
        )
        profiler = sum(seconds.get(k, 0.0) for k in PROFILER_PHASES)
        booked = profiler + sum(
            seconds.get(k, 0.0) for k in ("reference_check", "warmup", "timed_forwards")
        )
        share = b.total_device_s / measuring * 100 if measuring else 0.0
        lines.append(
            f"| {b.target} | {measuring:.1f} | {share:.1f} % | "
            f"{_per(seconds.get('reference_check', 0.0), b.forwards['reference'])} | "
            f"{_per(seconds.get('warmup', 0.0), b.forwards['warmup'])} | "
            f"{_per(seconds.get('timed_forwards', 0.0), b.forwards['timed'])} | "
            f"{_per(profiler, b.forwards['timed'])} | "
            f"{(measuring - booked) / max(b.points, 1) * 1e3:.2f} |"
        )
    if goal:
        fixed = fixed_total if fixed_s is None else fixed_s
        allowed = points / goal * 60.0
        left = allowed - fixed
        lines += [
            "",
            f"{goal:.0f} points a minute over these {points} points: {allowed:.1f} s start to "
            f"bundle; after {fixed:.1f} s of fixed start (process, probe, imports, builds"
            + (", as given" if fixed_s is not None else ", from the phase record")
            + f") {left:.1f} s are left for {forwards:,} forwards and everything else: "
            f"{left / max(forwards, 1) * 1e3:.3f} ms a forward all in "
            f"(the GPU needs {device / max(forwards, 1) * 1e3:.3f} ms a forward on average). "
            f"Phase record's wall: {wall:.1f} s.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples_root", type=Path)
    parser.add_argument("--phases", type=Path)
    parser.add_argument("--goal", type=float)
    parser.add_argument("--fixed-s", type=float)
    args = parser.parse_args(argv)
    files = sorted(args.samples_root.rglob("samples.jsonl"))
    if not files:
        print(f"no samples.jsonl under {args.samples_root}", file=sys.stderr)
        return 2
    budgets = [budget(f) for f in files]
    phases, wall = load_phases(args.phases) if args.phases else (None, 0.0)
    print(report(budgets, phases, wall, args.goal, args.fixed_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
