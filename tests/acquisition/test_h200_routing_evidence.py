"""The two routing profiles captured on the H200 (issue 15 part 4) and what docs/benchmarks.md
("Captured routing from the H200") derives from them. These checks fail if a profile, its prompt
set or its provenance is edited, or if the committed figures stop following from the files."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from moetables.profiles import read_profile

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs/evidence/h200-routing"
ROUTERS = {"normal_routing": "vllm simulator normal_routing", "native": "native"}


def _bench() -> ModuleType:
    path = ROOT / "bench/captured_routing_evidence.py"
    spec = importlib.util.spec_from_file_location("captured_routing_evidence", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ROUTERS)
def test_each_profile_is_the_device_file_with_its_provenance(name: str) -> None:
    path = EVIDENCE / f"{name}.routing.npz"
    readme = (EVIDENCE / "README.md").read_text()
    # The README's checksum is the file's: the file is kept byte for byte as captured.
    assert re.search(rf"`{name}\.routing\.npz` \| `{_sha(path)}`", readme)
    profile = read_profile(path)  # the project's own reader and validator
    meta = profile.meta
    assert meta["router"] == ROUTERS[name] and meta["source"] == "vllm"
    assert meta["versions"] == {"vllm": "0.26.0", "torch": "2.11.0+cu130"}
    assert meta["captured_at"].startswith("2026-12-01T02:05")
    assert "--load-format dummy" in meta["command"] and f"--router {name}" in meta["command"]
    assert meta["workload"]["prompts_sha256"] == _sha(EVIDENCE / "prompts.jsonl")
    assert (meta["workload"]["prompts"], meta["workload"]["prompt_tokens"]) == (64, 18_912)
    assert profile.layers == list(range(48))
    assert (profile.global_experts, profile.top_k, profile.steps) == (128, 8, 128)
    events = [
        json.loads(line) for line in (EVIDENCE / f"capture_{name}.jsonl").read_text().splitlines()
    ]
    assert events[-1]["phase"] == "done" and events[-1]["message"] == "128 steps written"
    assert (
        f"128 steps, 48 layers, imbalance max/mean {profile.imbalance().max():.2f}"
        in (EVIDENCE / f"capture_{name}.log").read_text()
    )


def test_the_skewed_simulator_loads_the_middle_ranks() -> None:
    skewed = read_profile(EVIDENCE / "normal_routing.routing.npz")
    native = read_profile(EVIDENCE / "native.routing.npz")
    assert skewed.imbalance().min() > 1.6 > native.imbalance().max() > 1.4
    # Whole-run pairs per EP4 rank: the two middle ranks carry more than the outer two together.
    stats = skewed.rank_statistics(4)
    pairs = stats.local_assignments.sum(axis=0)
    assert pairs[1] + pairs[2] > 2 * (pairs[0] + pairs[3])


def test_the_committed_figures_follow_from_the_profiles() -> None:
    """A cheap subset of bench/captured_routing_evidence.py, recomputed against estimate.json."""
    bench = _bench()
    committed = json.loads((EVIDENCE / "estimate.json").read_text())
    profile = read_profile(EVIDENCE / "normal_routing.routing.npz")
    bench.STAT_N = (16, 256)
    got = bench.rank_statistics(profile, 4)
    want = {r["N"]: r for r in committed["profiles"]["normal_routing"]["rank_statistics"]["4"]}
    for row in got:
        assert row == pytest.approx(want[row["N"]])
    # DP2/EP2 at 16 rows (decode): balanced well above captured (A: 64 vs about 40 per rank).
    bench.STEP_ROWS = (8,)
    step = bench.step_estimates(profile, 2)[0]
    want_step = committed["profiles"]["normal_routing"]["estimates"]["2"][0]
    assert set(step) == set(want_step) and step["tokens_per_rank"] == [8, 8]
    for key, value in step.items():
        if isinstance(value, float):
            assert value == pytest.approx(want_step[key], rel=1e-9), key
    assert step["balanced_over_captured"] > 0.3
