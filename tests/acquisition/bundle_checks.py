"""What every shipped H200 bundle test asserts of its tables' B/2B controls (R18)."""

from __future__ import annotations

from moetables.bundle import Bundle, load_quality, load_table


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
