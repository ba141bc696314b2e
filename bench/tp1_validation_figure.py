"""Figure of the TP1 engine validation (issue 18 part 3): the MoE block's measured expert path
against the estimate over N, balanced and from the captured counts with the tile charge.

Reads the comparisons `acquisition.estimate_validation` wrote into the evidence directory
(`comparison-f2.json`: without the charge, `comparison-f2-tiles.json`: with it).

    PYTHONPATH=. .venv/bin/python bench/tp1_validation_figure.py docs/evidence/h200-tp1-validation \
        --figure docs/figures/tp1_validation.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROUTINGS = {"simulator": "uniform (simulator)", "normal_routing": "skewed (normal_routing)"}


def _steps(path: Path, policy: str, routing: str) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    rows = [s for s in data["steps"] if (s["routing"], s["policy"]) == (routing, policy)]
    return sorted(rows, key=lambda s: s["tokens"][0])


def figure(evidence: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for col, (routing, title) in enumerate(ROUTINGS.items()):
        arms = {
            "balanced (no load)": _steps(evidence / "comparison-f2.json", "balanced", routing),
            "captured counts": _steps(evidence / "comparison-f2.json", "histogram", routing),
            "captured counts + tiles": _steps(
                evidence / "comparison-f2-tiles.json", "histogram", routing
            ),
        }
        top, bottom = axes[0][col], axes[1][col]
        measured = arms["captured counts + tiles"]
        top.plot(
            [s["tokens"][0] for s in measured],
            [s["experts_measured_us"] for s in measured],
            "k.-",
            label="measured (block less routing kernels)",
        )
        for (label, rows), style in zip(arms.items(), ("C0--", "C1:", "C2-"), strict=True):
            n = [s["tokens"][0] for s in rows]
            top.plot(n, [s["experts_estimate_us"] for s in rows], style, label=label)
            bottom.plot(n, [100 * s["experts_error"] for s in rows], style + "o", ms=3)
        for y in (-5, 5):
            bottom.axhline(y, color="grey", lw=0.6)
        bottom.set_ylim(-25, 25)
        top.set_title(f"TP1 engine, {title}")
        top.set_ylabel("expert path (us)")
        bottom.set_ylabel("estimate - measured (%)")
        bottom.set_xlabel("tokens N")
        bottom.set_xscale("symlog", linthresh=16)
        top.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("evidence", type=Path)
    p.add_argument("--figure", type=Path, required=True)
    args = p.parse_args(argv)
    figure(args.evidence, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
