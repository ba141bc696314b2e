"""One device call's acquisition runs, summarised: speed and the same answers (issue 19).

    PYTHONPATH=. python3 bench/acquisition_speed_summary.py RUN_ROOT \
        [--baseline modular=bundles/H200-vllm-modular-f2] [--baseline live=bundles/H200-vllm-live-f2]

RUN_ROOT is the ``ROOT`` of ``scripts/h200_acquisition_speed.sh`` (or the unpacked
``runs.tar.gz``): one directory per run label, each with ``phases.jsonl`` and ``out/``. Prints
the phase table of every run side by side (``bench/acquisition_phases.py``), then for every run
that published something, its point-by-point agreement with the shipped bundle of its backend
(a label containing ``modular`` or ``live``) and, where ``before-X`` and ``after-X`` both ran,
between the two (``bench/acquisition_equivalence.py``). Exit 1 if a comparison disagrees.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from acquisition_equivalence import HEADER, rows, source
from acquisition_phases import load, precompile_notes, table

MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"
BASELINES = {"modular": "bundles/H200-vllm-modular-f2", "live": "bundles/H200-vllm-live-f2"}


def backend_of(label: str) -> str | None:
    return next((name for name in BASELINES if name in label), None)


def compare(title: str, before: Path, after: Path, scratch: Path) -> tuple[list[str], bool]:
    """A titled equivalence table and whether every target agrees (or None were shared)."""
    try:
        a = source(before, MODEL, "H200", "bf16", scratch / "a")
        b = source(after, MODEL, "H200", "bf16", scratch / "b")
    except SystemExit as exc:
        return [f"### {title}", "", f"not compared: {exc}", ""], True
    found = rows(a, b)
    if not found:
        return [f"### {title}", "", "no deployment published by both", ""], True
    failing = [row.deployment for row in found if not row.agrees]
    verdict = "AGREE" if not failing else "DIFFER: " + ", ".join(failing)
    lines = [f"### {title}", "", *HEADER, *(row.markdown() for row in found), ""]
    lines.append(f"verdict: {verdict} (median change <= 1 %, same weight sets, all published)")
    return [*lines, ""], not failing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--baseline", action="append", default=[], metavar="BACKEND=BUNDLE")
    args = parser.parse_args(argv)
    baselines = dict(BASELINES)
    for item in args.baseline:
        name, _, path = item.partition("=")
        baselines[name] = path
    runs = sorted(p for p in args.root.iterdir() if (p / "phases.jsonl").is_file())
    if not runs:
        print(f"{args.root}: no run with a phase log", file=sys.stderr)
        return 1
    print("## Phases\n")
    loaded = [load(run / "phases.jsonl", run.name) for run in runs]
    print(table(loaded))
    if notes := precompile_notes(loaded):
        print()
        print(notes)
    for run in loaded:
        if any(status != 0 for status in run.exit_status):
            print(f"\n{run.label}: exit status {run.exit_status} (not every target published)")
    print("\n## Same answers\n")
    agree = True
    with tempfile.TemporaryDirectory() as scratch:
        for index, run in enumerate(runs):
            backend = backend_of(run.name)
            if backend is None or not (run / "out").is_dir():
                continue
            work = Path(scratch) / str(index)
            shipped = Path(baselines[backend])
            lines, ok = compare(f"{run.name} against {shipped}", shipped, run / "out", work / "s")
            print("\n".join(lines))
            agree &= ok
            if run.name.startswith("after-"):
                before = run.parent / ("before-" + run.name.removeprefix("after-"))
                if (before / "out").is_dir():
                    lines, ok = compare(
                        f"{run.name} against {before.name}", before / "out", run / "out", work / "b"
                    )
                    print("\n".join(lines))
                    agree &= ok
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
