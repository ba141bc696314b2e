"""A lookup answers the same on every CPU (R40, R43: one table, one answer).

A kernel-step table's small-N segments hold points on a plane, which `ExpertSurface` reduces to
two dimensions with an SVD. LAPACK's singular vectors come up to a sign that depends on the
BLAS kernel the CPU selects; before `canonical_basis`, an AVX-512 host and an AVX2 host
triangulated the same segment differently and answered up to 0.5 % apart (the committed lookup
sample failed on the first). These tests fail without the canonical basis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moetables.geometry import ExpertGeometry
from moetables.lookup.surface import ExpertSurface, canonical_basis
from tests.json_close import json_close

ROOT = Path(__file__).resolve().parents[2]
OLMOE = "H200-vllm-modular-f2k4/allenai/OLMoE-1B-7B-0924/bf16"


def test_sign_flips_and_rounding_give_one_basis() -> None:
    vt = np.array([[0.12403473458920847, 0.0, 0.9922778767136677], [0.0, 1.0, 0.0]])
    other = np.array(
        [[-0.12403473458920847, 2.220446049250313e-16, -0.9922778767136677], [-0.0, 1.0, 2e-16]]
    )
    assert np.array_equal(canonical_basis(vt), canonical_basis(other))
    assert np.array_equal(canonical_basis(-vt), canonical_basis(vt))
    got = canonical_basis(other)
    assert np.allclose(got @ got.T, np.eye(2))
    # Each vector's largest component is positive; equal magnitudes: the first decides.
    tie = canonical_basis(np.array([[-np.sqrt(0.5), np.sqrt(0.5), 0.0]]))
    assert tie[0, 0] > 0 and tie[0, 1] < 0


def _plane_surface() -> ExpertSurface:
    """Points with M = k N (every token's k pairs local), a plane in (N, A, M), on a grid whose
    Delaunay triangulation has ties (co-circular points) everywhere."""
    geometry = ExpertGeometry(global_experts=16, top_k=2, local_experts=16)
    tokens, active = np.meshgrid(np.arange(8, 17), np.arange(2, 17, 2))
    tokens, active = tokens.ravel(), active.ravel()
    keep = active <= 2 * tokens
    tokens, active = tokens[keep], active[keep]
    pairs = 2 * tokens
    times = 10.0 + 0.7 * tokens + 0.3 * active + 0.01 * tokens * active
    return ExpertSurface(
        tokens.astype(np.int64),
        active.astype(np.int64),
        pairs.astype(np.int64),
        times,
        geometry,
        label="plane",
    )


def test_a_planar_table_triangulates_alike_whatever_sign_lapack_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = _plane_surface()
    assert plain.dimension == 2
    queries = [(n, a, 2 * n) for n in range(8, 17) for a in range(2, 17)]

    def answers(surface: ExpertSurface) -> list[float | None]:
        out: list[float | None] = []
        for q in queries:
            try:
                out.append(surface.time(*q))
            except Exception:
                out.append(None)
        return out

    svd = np.linalg.svd

    def flipped(a: np.ndarray, full_matrices: bool = True) -> tuple[np.ndarray, ...]:
        u, s, vt = svd(a, full_matrices=full_matrices)
        # What another BLAS kernel may return: the other sign, rounding in the zero component.
        return -u, s, -vt + np.where(vt == 0.0, 2.2e-16, 0.0)

    monkeypatch.setattr(np.linalg, "svd", flipped)
    other = _plane_surface()
    monkeypatch.undo()
    assert plain._locator is not None and other._locator is not None
    assert np.array_equal(plain._locator.simplices, other._locator.simplices)
    assert json_close(answers(plain), answers(other))


_SAMPLE = """
import json, sys
sys.path.insert(0, {root!r})
from tests.moetables import lookup_sample
from moetables.lookup import ComponentTables
import hashlib
root = lookup_sample.BUNDLES / {bundle!r}
tables = ComponentTables(root)
e = tables.bundle.entries[0]
t = e.target
d = tables.deployment(t.tp, t.dp, t.rank, t.sequence_parallel)
key = f"{{root.relative_to(lookup_sample.BUNDLES)}} tp{{t.tp}} {{t.deployment}} eager"
seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
n, a, m = lookup_sample.sample(d._expert_points["eager"][0], e.geometry.top_k,
                               e.geometry.local_experts, e.geometry.remote_experts, seed)
got = d.batch("experts", n, a, m, "eager")
print(json.dumps([None if x != x else float(x) for x in got.time_us.tolist()]))
"""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


# (bundle, OpenBLAS kernels, CPU flag they need): pairs that answered apart before the fix.
CASES = [
    ("H200-vllm-live-f2k/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16", ("Haswell", "Prescott"), "avx2"),
    (OLMOE, ("SkylakeX", "Haswell"), "avx512f"),
]


@pytest.mark.parametrize(("bundle", "cores", "flag"), CASES)
def test_two_blas_kernels_answer_a_kernel_step_table_alike(
    bundle: str, cores: tuple[str, str], flag: str
) -> None:
    """The same lookups under two of OpenBLAS's kernels (OPENBLAS_CORETYPE picks them; the
    CPU must run both), in fresh processes."""
    if flag not in _cpu_flags():
        pytest.skip(f"OpenBLAS's {cores[0]} kernels need {flag}")
    code = _SAMPLE.format(root=str(ROOT), bundle=bundle)
    runs = []
    for core in cores:
        env = {**os.environ, "OPENBLAS_CORETYPE": core, "OPENBLAS_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        runs.append(json.loads(done.stdout))
    assert len(runs[0]) == 160 and sum(x is not None for x in runs[0]) > 40
    assert [x is None for x in runs[0]] == [x is None for x in runs[1]]
    assert json_close(runs[0], runs[1])
