"""`with_values`: a surface over the same points with other values answers exactly as a new
build over them (R40: one affine triangulation of the measured N/A/M, built once at load; issue
18's tile surfaces reuse the time surface's instead of building three more)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moetables import ComponentTables
from moetables.errors import CoverageError, QueryError
from moetables.lookup.segments import SegmentedExpertSurface
from moetables.lookup.surface import ExpertSurface

ROOT = Path(__file__).resolve().parents[2]
BUNDLES = {
    "kernel segments (f2k4, DP2 rank 1)": (
        "bundles/H200-vllm-modular-f2k4/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16",
        (1, 2, 1),
    ),
    "one triangulation (f2, DP1)": (
        "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16",
        (1, 1, 0),
    ),
    "all-remote rows (dp8-f4, DP8 rank 3)": (
        "bundles/H200-vllm-modular-dp8-f4/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16",
        (1, 8, 3),
    ),
}


def _answer(surface: object, n: int, a: int, m: int) -> tuple[str, object]:
    try:
        return "ok", surface.time(n, a, m)  # type: ignore[attr-defined]
    except (CoverageError, QueryError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("name", list(BUNDLES))
def test_other_values_answer_as_a_new_build_over_them(name: str) -> None:
    path, (tp, dp, rank) = BUNDLES[name]
    tables = ComponentTables(ROOT / path).deployment(tp, dp, rank)
    surface = tables._experts[("experts", "eager")]
    assert isinstance(surface, (ExpertSurface, SegmentedExpertSurface))
    n, a, m = tables._expert_points["eager"]
    rng = np.random.default_rng(5)
    values = rng.uniform(1.0, 500.0, n.shape[0])
    fresh = tables._surface(n, a, m, values, "probe")
    shared = surface.with_values(values, label="probe")
    assert type(shared) is type(fresh)
    queries = np.column_stack(
        [
            rng.integers(1, int(n.max()) + 40, 3000),
            rng.integers(0, int(a.max()) + 2, 3000),
            rng.integers(0, int(m.max()) + 50, 3000),
        ]
    )
    queries = np.vstack([queries, np.column_stack([n, a, m])])  # every measured point too
    got = shared.batch(queries[:, 0], queries[:, 1], queries[:, 2])
    want = fresh.batch(queries[:, 0], queries[:, 1], queries[:, 2])
    assert np.array_equal(got[1], want[1])
    assert np.array_equal(got[0], want[0], equal_nan=True)
    assert (want[1] == 0).sum() >= n.shape[0]  # inside support too, not only outside
    for q in queries[::25].tolist():
        assert _answer(shared, *q) == _answer(fresh, *q)
    # The surface it came from keeps its own values.
    assert surface.batch(n, a, m)[0].tolist() != shared.batch(n, a, m)[0].tolist()
    with pytest.raises(ValueError, match="values for"):
        surface.with_values(values[:-1], label="short")
