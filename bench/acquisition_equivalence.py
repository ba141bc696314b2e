"""Point-by-point agreement of two acquisitions of the same targets (issue 19).

    PYTHONPATH=. python3 bench/acquisition_equivalence.py BEFORE AFTER \
        [--model Qwen/Qwen3-30B-A3B-Instruct-2507] [--hardware H200] [--variant bf16] [--check]

Each argument is an acquisition ``--out-root``, or a shipped bundle directory such as
``bundles/H200-vllm-modular-f2`` (its tables under ``MODEL/VARIANT/``, its samples in
``MODEL/VARIANT.acquisition-samples.tar.gz``, unpacked to a temporary directory). For every
deployment both published, the rows measured by both (component, N, A, M) are compared: the
relative change of the stored time (median, p95, max), and for expert points the B/2B
decisions read from the samples (the verdict of the first control attempt, the weight-set
counts, and whether the point was published). The fast path must give the same answers:
median change <= 1 %, the same weight sets, every common point published by both; ``--check``
exits 1 otherwise. First-attempt verdicts are reported, not checked: points within noise of
the 3 % threshold flip between two runs of the same code (docs/benchmarks.md, issue 19).
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Key = tuple[str, int, int, int]


def table(path: Path) -> dict[Key, float]:
    rows: dict[Key, float] = {}
    for line in path.read_text().splitlines()[1:]:
        if not line.strip():
            continue
        component, _, n, a, m, t = line.strip().split(",")
        rows[(component, int(n), int(a), int(m))] = float(t)
    return rows


def decisions(path: Path) -> dict[str, tuple[bool, tuple[int, ...], str]]:
    """Per expert point: first control verdict, its weight-set counts, final status."""
    first: dict[str, tuple[bool, tuple[int, ...]]] = {}
    status: dict[str, str] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "control":
            key = record["point"]
            if key not in first or record["attempt"] == 0:
                first[key] = (bool(record["passed"]), tuple(record.get("sets") or ()))
        elif record["type"] == "point":
            status[record["point"]] = record["status"]
    return {k: (v[0], v[1], status.get(k, "open")) for k, v in first.items()}


def key_of(point: str) -> Key:
    component, *coords = point.split(":")
    if len(coords) == 1:
        return (component, int(coords[0]), -1, -1)
    return (component, int(coords[0]), int(coords[1]), int(coords[2]))


@dataclass(frozen=True)
class Source:
    """Where one side's tables and samples are."""

    tables: Path
    work: Path


def source(root: Path, model: str, hardware: str, variant: str, scratch: Path) -> Source:
    """An out-root as it is, or a shipped bundle with its samples unpacked into ``scratch``."""
    rest = Path(model) / variant / "tp1" / "moe_components"
    if (root / hardware / rest).is_dir():
        return Source(root / hardware / rest, root / "_acquisition" / hardware / rest)
    archive = root / model / f"{variant}.acquisition-samples.tar.gz"
    if (root / rest).is_dir() and archive.exists():
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        return Source(root / rest, scratch / "out" / "_acquisition" / hardware / rest)
    raise SystemExit(f"{root}: neither an out-root nor a bundle with samples for {model}")


@dataclass(frozen=True)
class Row:
    deployment: str
    common: int
    median: float
    p95: float
    largest: float
    worst: Key
    shared: int
    same_verdict: int
    same_sets: int
    both: int

    @property
    def agrees(self) -> bool:
        return self.median <= 0.01 and self.same_sets == self.shared == self.both

    def markdown(self) -> str:
        return (
            f"| {self.deployment} | {self.common} | {self.median * 100:.2f} % | "
            f"{self.p95 * 100:.2f} % | {self.largest * 100:.2f} % | "
            f"{':'.join(map(str, self.worst))} | {self.same_verdict}/{self.shared} | "
            f"{self.same_sets}/{self.shared} | {self.both}/{self.shared} |"
        )


HEADER = [
    "| target | points in both | median change | p95 | max | largest at | "
    "same first B/2B verdict | same weight sets | published in both |",
    "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
]


def rows(before: Source, after: Source) -> list[Row]:
    found = []
    for csv in sorted(before.tables.glob("*/components.csv")):
        deployment = csv.parent.name
        other = after.tables / deployment / "components.csv"
        if not other.exists():
            continue
        a, b = table(csv), table(other)
        common = sorted(set(a) & set(b))
        if not common:
            continue
        change = np.array([abs(b[k] - a[k]) / a[k] for k in common])
        da = decisions(before.work / deployment / "samples.jsonl")
        db = decisions(after.work / deployment / "samples.jsonl")
        keys = set(common)
        shared = [p for p in da if p in db and key_of(p) in keys]
        found.append(
            Row(
                deployment,
                len(common),
                float(np.median(change)),
                float(np.percentile(change, 95)),
                float(change.max()),
                common[int(np.argmax(change))],
                len(shared),
                sum(da[p][0] == db[p][0] for p in shared),
                sum(da[p][1] == db[p][1] for p in shared),
                sum(da[p][2] == db[p][2] == "measured" for p in shared),
            )
        )
    return found


def compare(before: Path, after: Path, model: str, hardware: str, variant: str) -> list[str]:
    """The Markdown table of two out-roots or bundles (header only if nothing is shared)."""
    with tempfile.TemporaryDirectory() as scratch:
        a = source(before, model, hardware, variant, Path(scratch) / "before")
        b = source(after, model, hardware, variant, Path(scratch) / "after")
        return HEADER + [row.markdown() for row in rows(a, b)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--model", default="Qwen/Qwen3-30B-A3B-Instruct-2507")
    parser.add_argument("--hardware", default="H200")
    parser.add_argument("--variant", default="bf16")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless every target agrees (see above)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        before = source(args.before, args.model, args.hardware, args.variant, Path(scratch) / "a")
        after = source(args.after, args.model, args.hardware, args.variant, Path(scratch) / "b")
        found = rows(before, after)
    if not found:
        print("no deployment was published by both runs", file=sys.stderr)
        return 1
    print("\n".join(HEADER + [row.markdown() for row in found]))
    failing = [row.deployment for row in found if not row.agrees]
    verdict = "AGREE" if not failing else "DIFFER: " + ", ".join(failing)
    print(f"\nverdict: {verdict} (median change <= 1 %, same weight sets, all published)")
    return 1 if args.check and failing else 0


if __name__ == "__main__":
    sys.exit(main())
