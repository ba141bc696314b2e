"""The shipped Qwen3-30B-A3B bf16 kernel-step tables (issue 20, item 1): `H200-vllm-modular-f2k`
(TP1/DP1 and TP1/DP2/EP2 ranks 0 and 1) and `H200-vllm-live-f2k` (TP1), measured on one H200 in
session 5 (docs/h200-runs.md, "Session 5"; bundles/README.md, "The kernel-step tables").

These checks fail if a bundle is edited or truncated, if a table stops being its own samples, if
its contract loses the kernel-step record or its conservation evidence, or if the plan the rule
gives today (from configuration only, R10) is no longer the plan that was measured.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import tarfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from moetables.bundle import open_bundle, validate_bundle

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.loo_surfaces import planned_with_rule  # noqa: E402

MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"
MODULAR = ROOT / "bundles/H200-vllm-modular-f2k" / MODEL / "bf16"
LIVE = ROOT / "bundles/H200-vllm-live-f2k" / MODEL / "bf16"
RULE = "vllm-0.26.0-triton-config-steps-v2"
# Per target: rows per component and the expert points the rule added to the factor-2 grid.
DP1 = "dp1_ep1_rank0_sp0"
RANKS = ("dp2_ep2_rank0_sp0", "dp2_ep2_rank1_sp0")
EXPECTED: dict[tuple[str, str], tuple[dict[str, int], str, int]] = {
    ("modular", DP1): (
        {"gate_routing": 13, "experts": 555},
        "E=128,N=768,device_name=NVIDIA_H200.json",
        500,
    ),
    **{
        ("modular", rank): (
            {"gate_routing": 13, "experts": 1181, "finalize_copy": 13},
            "get_default_config",
            529,
        )
        for rank in RANKS
    },
    ("live", DP1): (
        {"gate_routing": 13, "experts": 555},
        "E=128,N=768,device_name=NVIDIA_H200.json",
        500,
    ),
}
FOLDERS = {"modular": MODULAR, "live": LIVE}
CASES = sorted(EXPECTED)


def _entries(kind: str) -> dict[str, dict[str, Any]]:
    meta = yaml.safe_load((FOLDERS[kind] / "meta.yaml").read_text())
    entries: list[dict[str, Any]] = meta["per_tp"][1]["moe_components"]["entries"]
    return {e["table"].split("/")[1]: e for e in entries}


def _table(kind: str, target: str, name: str = "components.csv") -> list[dict[str, str]]:
    with (FOLDERS[kind] / "tp1/moe_components" / target / name).open(newline="") as f:
        return list(csv.DictReader(f))


def _key(row: dict[str, str]) -> str:
    if row["component"] != "experts":
        return f"{row['component']}:{row['tokens']}"
    return f"experts:{row['tokens']}:{row['activated_experts']}:{row['local_assignments']}"


@cache
def _archived(kind: str) -> dict[str, dict[str, float]]:
    """Measured point records per target in the samples archive beside the bundle."""
    out: dict[str, dict[str, float]] = {}
    with tarfile.open(FOLDERS[kind].parent / "bf16.acquisition-samples.tar.gz") as tar:
        names = tar.getnames()
        assert not [n for n in names if n.endswith(".lock")]  # no writer locks shipped
        for required in ("run.log", "progress.jsonl", "phases.jsonl"):
            assert required in names
        for member in tar.getmembers():
            if not member.name.endswith("samples.jsonl"):
                continue
            assert member.name.startswith("out/_acquisition/H200/" + MODEL + "/bf16/tp1/")
            f = tar.extractfile(member)
            assert f is not None
            points: dict[str, float] = {}
            for line in io.TextIOWrapper(f, encoding="utf-8"):
                if '"type": "point"' in line:
                    record = json.loads(line)
                    if record["status"] == "measured":
                        points[record["point"]] = record["time_us"]
            out[member.name.split("/")[-2]] = points
    return out


@pytest.mark.parametrize("kind", ["modular", "live"])
def test_it_validates_with_its_targets(kind: str) -> None:
    """R38: each table's sha256 matches its bytes; the deployments the bundle was planned for."""
    report = validate_bundle(FOLDERS[kind])
    assert report.ok, report.problems
    targets = {t for k, t in EXPECTED if k == kind}
    assert set(_entries(kind)) == targets


@pytest.mark.parametrize(("kind", "target"), CASES)
def test_each_contract_records_the_kernel_step_plan(kind: str, target: str) -> None:
    """Issue 20 item 1: the rule, its configuration source and the points it added are in the
    contract; the command line is the factor-2 grid with kernel steps on."""
    counts, source, added = EXPECTED[(kind, target)]
    contract = _entries(kind)[target]["contract"]
    steps = contract["expert_sampling"]["kernel_steps"]
    assert steps["rule"] == RULE
    assert steps["config_source"] == source
    assert steps["expert_points_added"] == added
    assert steps["vllm_version"] == "0.26.0"
    assert contract["expert_sampling"]["factor"] == 2
    assert contract["backend"]["name"] == f"vllm-{kind}"
    assert contract["provenance"]["device_name"] == "NVIDIA H200"
    command = contract["provenance"]["command_line"]
    assert "--moe-grid-factor 2 --moe-kernel-steps on" in command
    assert f"--backend vllm-{kind}" in command
    seen: dict[str, int] = {}
    for row in _table(kind, target):
        seen[row["component"]] = seen.get(row["component"], 0) + 1
    assert seen == counts


@pytest.mark.parametrize(("kind", "target"), CASES)
def test_the_measured_points_are_the_rules_plan_today(kind: str, target: str) -> None:
    """R10: plan points come from configuration only; the kernel-step rule run today on the
    contract's options gives exactly the table's expert points."""
    bundle = open_bundle(FOLDERS[kind])
    entry = next(e for e in bundle.entries if e.target.deployment == target)
    planned = planned_with_rule(entry)
    table = {
        (int(r["tokens"]), int(r["activated_experts"]), int(r["local_assignments"]))
        for r in _table(kind, target)
        if r["component"] == "experts"
    }
    assert table == planned


@pytest.mark.parametrize(("kind", "target"), CASES)
def test_every_expert_point_passed_b_2b_and_the_path_is_conserved(kind: str, target: str) -> None:
    """R18: every published expert row has a passed control at 3 %; R26: the table's build
    traced its native forwards (conservation.csv beside it, as the contract's quality says)."""
    entry = _entries(kind)[target]
    counts = EXPECTED[(kind, target)][0]
    coverage = entry["coverage"]
    assert coverage["complete"] is True
    assert coverage["conditioning_summary"]["failed_points"] == 0
    assert coverage["conditioning_summary"]["checked_points"] == counts["experts"]
    published = [r for r in _table(kind, target, "stability.csv") if r["published"] == "1"]
    assert len(published) == counts["experts"]
    assert all(r["passed"] == "1" and float(r["relative_change"]) <= 0.03 for r in published)
    quality = entry["quality"]
    assert quality["conservation"]["file"].endswith(f"{target}/conservation.csv")
    conservation = _table(kind, target, "conservation.csv")
    assert len(conservation) > 0


@pytest.mark.parametrize(("kind", "target"), CASES)
def test_every_row_is_a_measured_sample_in_the_archive(kind: str, target: str) -> None:
    """The table is its own checkpoint's measurements, kept beside the bundle."""
    archived = _archived(kind)
    assert set(archived) == {t for k, t in EXPECTED if k == kind}
    for row in _table(kind, target):
        assert archived[target][_key(row)] == pytest.approx(float(row["time_us"]), abs=1e-9)


@pytest.mark.parametrize("target", [DP1, *RANKS])
def test_the_modular_tables_record_the_kernel_measured_tile_cost(target: str) -> None:
    """Issue 18 part 2 (format 3): rows stay the balanced stimulus' and the cost of one extra
    128-row tile is the kernel run's for this geometry (tuned config at 128 local experts, the
    default at 64), with the timed loads beside the table. The live TP1 table runs the same
    expert kernel at the same geometry and records the DP1 table's per-block costs from the
    same evidence (so a by-name TP1/DP1 lookup with `loads`, which picks it, is answered)."""
    loads = _entries("modular")[target]["expert_loads"]
    assert loads["rows"] == "balanced"
    # The TP1/DP1 table (format 4) records a cost per block size, 128 rows first; the DP2/EP2
    # ranks keep their one format-3 model.
    model = loads["tile_models"][0] if target == DP1 else loads["tile_model"]
    assert model["block_m"] == 128 and model["vllm_version"] == "0.26.0"
    assert model["tile_cost_us"] == (1.416 if target == DP1 else 1.764)
    assert (MODULAR / "tp1" / model["evidence"]["file"]).is_file()
    live = _entries("live")[DP1]["expert_loads"]["tile_models"]
    if target == DP1:
        assert live == loads["tile_models"]
