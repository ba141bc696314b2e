"""Pieces the evidence scripts of the shipped bundles share, on CPU.

Used by ``bench/f2_evidence.py``, ``bench/fp8_evidence.py``, ``bench/models_evidence.py`` and
``scripts/h200_vllm_evidence.py``: a table's eager rows by (component, N, A, M); the heaviest
expert row at the largest N against the two physical bounds of ``moetables.bounds``; the
spread of the ratios of two tables at the points both measured; the command line and the
figure plumbing of the scripts. One copy, so that every evidence table in docs/benchmarks.md
reads rows and bounds the same way.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetables.bounds import ExpertBounds, entry_bounds
from moetables.bundle import (
    Bundle,
    ComponentTable,
    TableEntry,
    load_quality,
    load_table,
    open_bundle,
)
from moetables.bundle.quality import StabilityRow

# (component, N tokens, A activated experts, M local token-expert pairs)
Key = tuple[str, int, int, int]
# (bundle folder, model id, bundle, one of its tables)
ModelTable = tuple[str, str, Bundle, TableEntry]


def eager_rows(table: ComponentTable) -> dict[Key, float]:
    """Time (us) of every eager row of ``table`` by its (component, N, A, M)."""
    out: dict[Key, float] = {}
    for i in range(len(table)):
        if table.mode[i] == "eager":
            key = (
                str(table.component[i]),
                int(table.tokens[i]),
                int(table.activated_experts[i]),
                int(table.local_assignments[i]),
            )
            out[key] = float(table.time_us[i])
    return out


@dataclass(frozen=True)
class Checks:
    """A table's B/2B controls (``stability.csv``): the published ones and the failed ones kept."""

    published: int
    passed: int
    later: int  # published at a later attempt
    failed_attempts: int
    largest_change: float  # of the published controls

    @classmethod
    def of(cls, stability: Iterable[StabilityRow]) -> Checks:
        rows = list(stability)
        published = [r for r in rows if r.published]
        return cls(
            published=len(published),
            passed=sum(1 for r in published if r.passed),
            later=sum(1 for r in published if r.attempt > 0),
            failed_attempts=len(rows) - len(published),
            largest_change=max(r.relative_change for r in published),
        )

    def cells(self) -> str:
        """``checked | passed | passed at a later attempt | largest published change``."""
        return f"{self.published} | {self.passed} | {self.later} | {self.largest_change:.1%}"


def heaviest_at_largest_n(measured: Iterable[Key]) -> Key:
    """The row at the largest N with the most experts, then the most pairs."""
    keys = list(measured)
    top = max(k[1] for k in keys)
    return max((k for k in keys if k[1] == top), key=lambda k: (k[2], k[3]))


@dataclass(frozen=True)
class BoundsAtLargestN:
    """A table's expert rows, its bounds and its heaviest expert row at the largest N."""

    measured: dict[Key, float]
    bounds: ExpertBounds
    key: Key

    @property
    def time_us(self) -> float:
        return self.measured[self.key]

    @property
    def memory_us(self) -> float:
        return float(self.bounds.memory_us(self.key[2]))

    @property
    def compute_us(self) -> float:
        return float(self.bounds.compute_us(self.key[3]))

    def cells(self) -> str:
        """``N | A | M | measured | memory bound | compute bound | memory/t | compute/t``."""
        t, mem, comp = self.time_us, self.memory_us, self.compute_us
        return (
            f"{self.key[1]} | {self.key[2]} | {self.key[3]} | "
            f"{t:.1f} | {mem:.1f} | {comp:.1f} | {mem / t:.2f} | {comp / t:.2f}"
        )


def bounds_at_largest_n(b: Bundle, entry: TableEntry) -> BoundsAtLargestN | None:
    """The expert rows of ``entry`` against its bounds; None where it has no expert rows."""
    measured = {k: v for k, v in eager_rows(load_table(b.root, entry)).items() if k[0] == "experts"}
    if not measured:
        return None
    return BoundsAtLargestN(measured, entry_bounds(b, entry), heaviest_at_largest_n(measured))


def print_bounds_table(title: str, bundles: Iterable[tuple[str, Bundle]]) -> None:
    """One markdown row per table of ``bundles`` (label, bundle) with expert rows."""
    print(f"### {title}\n")
    print(
        "| bundle | target | N | A | M | measured us | memory bound us | compute bound us | "
        "memory/measured | compute/measured |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, b in bundles:
        for entry in b.entries:
            row = bounds_at_largest_n(b, entry)
            if row is not None:
                print(f"| {name} | {entry.target.deployment} | {row.cells()} |")
    print()


def open_model_bundle(folder: str, model: str, variant: str = "bf16") -> Bundle:
    """A shipped bundle by its folder under ``bundles/`` and its model id."""
    return open_bundle(Path(__file__).resolve().parents[1] / "bundles" / folder / model / variant)


def model_tables(pairs: Iterable[tuple[str, str]]) -> Iterator[ModelTable]:
    """Every table of the shipped bundles ``(folder, model)``, in order."""
    for folder, model in pairs:
        b = open_model_bundle(folder, model)
        for entry in b.entries:
            yield folder, model, b, entry


def print_points_and_checks(tables: Iterable[ModelTable]) -> None:
    """Per table: rows by component and its B/2B controls (``stability.csv``)."""
    print("### Points and B/2B checks per table\n")
    print(
        "| bundle | model | target | rows (components) | expert points | checked | passed | "
        "passed at a later attempt | failed attempts kept | largest published change |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for folder, model, b, entry in tables:
        table = load_table(b.root, entry)
        parts: dict[str, int] = defaultdict(int)
        for c in table.component:
            parts[str(c)] += 1
        counts = ", ".join(f"{c} {n}" for c, n in sorted(parts.items()))
        quality = load_quality(b.root, entry, table)
        assert quality.stability is not None, f"{folder} {model}: no stability.csv"
        checks = Checks.of(quality.stability)
        print(
            f"| {folder} | {model.split('/')[1]} | {entry.target.deployment} | "
            f"{len(table)} ({counts}) | {parts['experts']} | {checks.published} | "
            f"{checks.passed} | {checks.later} | {checks.failed_attempts} | "
            f"{checks.largest_change:.1%} |"
        )
    print()


def print_bounds_at_largest_n(tables: Iterable[ModelTable]) -> None:
    """Per table: its heaviest expert row at the largest N against the two physical bounds."""
    print("### Expert time at the largest N against the two physical bounds\n")
    print(
        "| bundle | model | target | N | A | M | measured us | memory bound us | "
        "compute bound us | memory/measured | compute/measured | tightest row anywhere |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for folder, model, b, entry in tables:
        row = bounds_at_largest_n(b, entry)
        assert row is not None, f"{folder} {model}: no expert rows"
        bounds = row.bounds
        # bound / measured of every row: how close to a peak the closest row runs
        closeness = {
            k: max(float(bounds.memory_us(k[2])), float(bounds.compute_us(k[3]))) / t_k
            for k, t_k in row.measured.items()
            if k[2] > 0
        }
        tight = max(closeness, key=lambda k: closeness[k])
        print(
            f"| {folder} | {model.split('/')[1]} | {entry.target.deployment} | "
            f"{row.cells()} | "
            f"N={tight[1]} A={tight[2]} M={tight[3]}: {closeness[tight]:.2f} |"
        )
    print()


def ratios(num: Mapping[Key, float], den: Mapping[Key, float], component: str) -> list[float]:
    """``num / den`` of ``component`` at the points both tables measured."""
    return [num[k] / den[k] for k in sorted(set(num) & set(den)) if k[0] == component]


def spread_cells(values: Sequence[float], digits: int = 3) -> str:
    """``count | median | min | max`` of ``values``, for a markdown row."""
    return (
        f"{len(values)} | {statistics.median(values):.{digits}f} | "
        f"{min(values):.{digits}f} | {max(values):.{digits}f}"
    )


def run_with_figures(
    sections: Sequence[Callable[[], None]], figures: Callable[[Path], None]
) -> None:
    """The scripts' command line: print every section, then draw under ``--figures DIR``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--figures", type=Path, default=None)
    args = parser.parse_args()
    for section in sections:
        section()
    if args.figures is not None:
        figures(args.figures)


def pyplot(out: Path) -> Any:
    """matplotlib's pyplot without a display, with ``out`` created for the figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    return plt


def save_figure(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
