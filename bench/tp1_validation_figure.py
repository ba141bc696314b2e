"""Figure and summary of the TP1 engine validation (issue 18 part 3): the MoE block's measured
expert path against the estimate over N, from the captured counts with the tile charge, with the
factor-2 table and with the kernel-step table, for each routing in the evidence.

Reads the comparisons `acquisition.estimate_validation` wrote into the evidence directory:
`comparison-f2.json` (factor-2 modular table, no charge), `comparison-f2-tiles.json` (with it),
`comparison-f2k-tiles.json` (the kernel-step modular table, with it), `comparison-f2-waves.json`
when present (the factor-2 table with its recorded models: per-block tile costs and the 32-row
wave charge, bundle format 5; else `comparison-f2k-blocks.json`, format 4's per-block costs) and,
for ``--summary``, every `comparison-*.json` there.

    PYTHONPATH=. .venv/bin/python bench/tp1_validation_figure.py docs/evidence/h200-tp1-validation \
        --figure docs/figures/tp1_validation.png --summary
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

ROUTINGS = {
    "simulator": "uniform (simulator)",
    "normal_routing": "skewed (normal_routing)",
    "native": "engine's own router (native)",
}
# Steps that the kernel-step tables were expected to fix (docs/benchmarks.md, "On the real
# engine: TP1"): read apart in the summary.
SWITCH_STEPS = (384, 777)


def _steps(path: Path, policy: str, routing: str) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    rows = [s for s in data["steps"] if (s["routing"], s["policy"]) == (routing, policy)]
    return sorted(rows, key=lambda s: s["tokens"][0])


def figure(evidence: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routings = [
        r for r in ROUTINGS if _steps(evidence / "comparison-f2-tiles.json", "histogram", r)
    ]
    fig, axes = plt.subplots(2, len(routings), figsize=(5.5 * len(routings), 7), sharex=True)
    for col, routing in enumerate(routings):
        arms = {
            "f2, captured counts": _steps(evidence / "comparison-f2.json", "histogram", routing),
            "f2, counts + tiles": _steps(
                evidence / "comparison-f2-tiles.json", "histogram", routing
            ),
            "f2k (kernel steps), counts + tiles": _steps(
                evidence / "comparison-f2k-tiles.json", "histogram", routing
            ),
        }
        waves = evidence / "comparison-f2-waves.json"
        blocks = evidence / "comparison-f2k-blocks.json"
        if waves.is_file():  # the per-block costs with the 32-row wave charge (format 5)
            arms["f2, counts + per-block costs, 32-row waves"] = _steps(waves, "histogram", routing)
        elif blocks.is_file():  # the per-block costs (bundle format 4)
            arms["f2k, counts + per-block tile costs"] = _steps(blocks, "histogram", routing)
        top, bottom = axes[0][col], axes[1][col]
        measured = arms["f2, counts + tiles"]
        top.plot(
            [s["tokens"][0] for s in measured],
            [s["experts_measured_us"] for s in measured],
            "k.-",
            label="measured (block less routing kernels)",
        )
        styles = ("C1:", "C2-", "C3--", "C4-.")[: len(arms)]
        for (label, rows), style in zip(arms.items(), styles, strict=True):
            n = [s["tokens"][0] for s in rows]
            top.plot(n, [s["experts_estimate_us"] for s in rows], style, label=label)
            bottom.plot(n, [100 * s["experts_error"] for s in rows], style + "o", ms=3)
        for y in (-5, 5):
            bottom.axhline(y, color="grey", lw=0.6)
        bottom.set_ylim(-25, 25)
        top.set_title(f"TP1 engine, {ROUTINGS[routing]}")
        top.set_ylabel("expert path (us)")
        bottom.set_ylabel("estimate - measured (%)")
        bottom.set_xlabel("tokens N")
        bottom.set_xscale("symlog", linthresh=16)
        top.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def _cell(errors: list[tuple[int, float]]) -> str:
    """``median %, worst % (N = n)`` of signed errors per step."""
    if not errors:
        return "-"
    median = statistics.median(abs(e) for _, e in errors)
    n, worst = max(errors, key=lambda x: abs(x[1]))
    return f"{median:.1%}, {worst:+.1%} (N = {n:,})"


def summary(evidence: Path) -> str:
    """Markdown: per comparison and routing (captured counts), block and expert path medians and
    worst steps, over all steps, without N = 384 and 777, and from N = 1,024 on."""
    lines = [
        "| comparison | routing | block: median, worst | expert path: median, worst | "
        "block without N = 384, 777 | expert path without N = 384, 777 | "
        "block from N = 1,024 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(evidence.glob("comparison-*.json")):
        for routing in ROUTINGS:
            steps = _steps(path, "histogram", routing)
            if not steps:
                continue
            block = [(s["tokens"][0], s["compute_error"]) for s in steps]
            path_ = [(s["tokens"][0], s["experts_error"]) for s in steps]
            lines.append(
                f"| {path.stem.removeprefix('comparison-')} | {routing} | {_cell(block)} | "
                f"{_cell(path_)} | {_cell([b for b in block if b[0] not in SWITCH_STEPS])} | "
                f"{_cell([b for b in path_ if b[0] not in SWITCH_STEPS])} | "
                f"{_cell([b for b in block if b[0] >= 1024])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("evidence", type=Path)
    p.add_argument("--figure", type=Path)
    p.add_argument("--summary", action="store_true", help="print the markdown summary table")
    args = p.parse_args(argv)
    if args.figure is not None:
        figure(args.evidence, args.figure)
    if args.summary:
        print(summary(args.evidence))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
