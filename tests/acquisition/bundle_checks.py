"""What every shipped H200 bundle test asserts of its tables' B/2B controls (R18)."""

from __future__ import annotations

from bench.bundle_evidence import eager_rows, ratios
from moetables.bundle import Bundle, load_quality, load_table
from moetables.geometry import MoeTarget


def checked_rows(bundle: Bundle) -> dict[str, int]:
    """Rows per deployment, after checking that every published expert point passed its B/2B
    control within 3 % and that each expert row has exactly one published control."""
    found = {}
    for entry in bundle.entries:
        table = load_table(bundle.root, entry)
        found[entry.target.deployment] = len(table)
        quality = load_quality(bundle.root, entry, table)
        assert quality.stability is not None, entry.target.deployment
        published = [r for r in quality.stability if r.published]
        assert published and all(r.passed for r in published)
        assert max(r.relative_change for r in published) <= 0.03
        assert len(published) == int((table.component == "experts").sum())
    return found


def shared_row_ratios(new: Bundle, old: Bundle, target: MoeTarget) -> dict[str, list[float]]:
    """A re-measured target (a denser plan, another GPU): checks that its table holds every
    eager row the older one measured, and returns per component new / old at those rows."""
    now = eager_rows(load_table(new.root, next(e for e in new.entries if e.target == target)))
    then = eager_rows(load_table(old.root, next(e for e in old.entries if e.target == target)))
    assert set(then) < set(now), target
    return {c: ratios(now, then, c) for c in sorted({k[0] for k in then})}
