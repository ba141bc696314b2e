"""The table page's expert surface on a table of many N (QA, session 5): every M slice it
offers shows the rows measured at that M, also where the N grid is thinned."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from frontend import figures
from moetables import ComponentTables, open_bundle
from moetables.bundle import load_table

BUNDLES = Path(__file__).resolve().parents[2] / "bundles"
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


@pytest.mark.parametrize("kind", ["modular", "live"])
def test_every_slice_of_a_kernel_step_table_shows_its_measured_rows(kind: str) -> None:
    """The TP1/DP1 kernel-step tables have > 96 N, one M per N: before, most slices were blank."""
    folder = BUNDLES / f"H200-vllm-{kind}-f2k" / QWEN
    bundle = open_bundle(folder)
    lookups = ComponentTables(folder).deployment(1, 1, 0)
    entry = lookups.entry
    rows = load_table(bundle.root, entry)
    measured = [r for r in rows.rows() if r[0] == "experts" and r[1] == "eager" and r[3] > 0]
    assert len({r[2] for r in measured}) > figures.MAX_GRID_TOKENS  # the grid is thinned
    slices = figures.expert_slices(rows, entry.geometry, "current")
    blank = []
    for chosen in slices:
        fig = figures.expert_slice_figure(lookups, rows, entry.geometry, chosen)
        z = np.array([[np.nan if v is None else v for v in r] for r in fig["data"][0]["z"]])
        xs, ys = fig["data"][0]["x"], fig["data"][0]["y"]
        for _, _, n, a, m, t in measured:
            if m == chosen.pairs:
                cell = z[ys.index(a), xs.index(n)]
                # a stored row is answered verbatim (R40); the figure rounds its cells
                if not abs(cell - t) <= 1e-3:
                    blank.append((n, a, m, cell))
    assert blank == []
