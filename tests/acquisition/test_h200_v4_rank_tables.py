"""The rule-v4 TP1/DP2/EP2 rank tables in `bundles/H200-vllm-modular-f2k4` (session 8).

Measured in one process on one H200 (docs/h200-runs.md, "Session 8") and moved beside the
bundle's TP1/DP1 table by `python -m acquisition.transplant`. These checks fail if a rank table
is edited or truncated, stops being its own archived samples, loses its kernel-step record or its
B/2B and conservation evidence, or if the rule today plans other points (R10).
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
FOLDER = ROOT / "bundles/H200-vllm-modular-f2k4" / MODEL / "bf16"
RANKS = ("dp2_ep2_rank0_sp0", "dp2_ep2_rank1_sp0")
RULE = "vllm-0.26.0-triton-config-steps-v4"
COUNTS = {"gate_routing": 13, "experts": 1404, "finalize_copy": 13}


@cache
def _entries() -> dict[str, dict[str, Any]]:
    meta = yaml.safe_load((FOLDER / "meta.yaml").read_text())
    entries: list[dict[str, Any]] = meta["per_tp"][1]["moe_components"]["entries"]
    return {e["table"].split("/")[1]: e for e in entries}


def _table(target: str, name: str = "components.csv") -> list[dict[str, str]]:
    with (FOLDER / "tp1/moe_components" / target / name).open(newline="") as f:
        return list(csv.DictReader(f))


@cache
def _archived() -> dict[str, dict[str, float]]:
    """Measured point records of the ranks' checkpoints in the archive beside the bundle."""
    out: dict[str, dict[str, float]] = {}
    with tarfile.open(FOLDER.parent / "bf16.acquisition-samples.tar.gz") as tar:
        names = tar.getnames()
        assert not [n for n in names if n.endswith(".lock")]
        for required in ("run.log", "progress.jsonl", "phases.jsonl"):
            assert f"dp2-ranks/{required}" in names
        for member in tar.getmembers():
            parts = member.name.split("/")
            if parts[-1] != "samples.jsonl" or parts[-2] not in RANKS:
                continue
            target = parts[-2]
            f = tar.extractfile(member)
            assert f is not None
            out[target] = {
                r["point"]: r["time_us"]
                for line in io.TextIOWrapper(f, encoding="utf-8")
                if '"type": "point"' in line and (r := json.loads(line))["status"] == "measured"
            }
    return out


def test_the_bundle_holds_dp1_and_both_ranks_and_validates() -> None:
    """R38: each table's sha256 matches its bytes; the ranks joined the DP1 table."""
    report = validate_bundle(FOLDER)
    assert report.ok, report.problems
    assert set(_entries()) == {"dp1_ep1_rank0_sp0", *RANKS}
    meta = yaml.safe_load((FOLDER / "meta.yaml").read_text())
    moved = {m["deployment"]: m for m in meta["transplanted"]}
    for rank in RANKS:
        assert moved[f"tp1/{rank}"]["table_sha256"] == _entries()[rank]["coverage"]["table_sha256"]
        assert "h200_acquisition_speed.sh v4-dp2" in moved[f"tp1/{rank}"]["note"]


@pytest.mark.parametrize("target", RANKS)
def test_each_rank_records_rule_v4_and_its_rows(target: str) -> None:
    """Issue 20 item 1: the v4 rule on the EP2 geometry (default config at 64 local experts)."""
    contract = _entries()[target]["contract"]
    steps = contract["expert_sampling"]["kernel_steps"]
    assert steps["rule"] == RULE
    assert steps["config_source"] == "get_default_config" and steps["expert_map"] is True
    assert contract["provenance"]["device_name"] == "NVIDIA H200"
    assert "--dp 2 --backend vllm-modular" in contract["provenance"]["command_line"]
    seen: dict[str, int] = {}
    for row in _table(target):
        seen[row["component"]] = seen.get(row["component"], 0) + 1
    assert seen == COUNTS


@pytest.mark.parametrize("target", RANKS)
def test_the_rank_tables_are_the_rules_plan_today(target: str) -> None:
    """R10: the v4 rule run today on the contract's options gives exactly the expert points."""
    entry = next(e for e in open_bundle(FOLDER).entries if e.target.deployment == target)
    table = {
        (int(r["tokens"]), int(r["activated_experts"]), int(r["local_assignments"]))
        for r in _table(target)
        if r["component"] == "experts"
    }
    assert table == planned_with_rule(entry)


@pytest.mark.parametrize("target", RANKS)
def test_every_rank_point_passed_b_2b_and_is_an_archived_sample(target: str) -> None:
    """R18: every published expert row passed its 3 % check; R26: conservation traced; the
    rows are the checkpoint's own measured points."""
    entry = _entries()[target]
    summary = entry["coverage"]["conditioning_summary"]
    assert entry["coverage"]["complete"] is True
    assert summary["failed_points"] == 0 and summary["checked_points"] == COUNTS["experts"]
    published = [r for r in _table(target, "stability.csv") if r["published"] == "1"]
    assert len(published) == COUNTS["experts"]
    assert all(r["passed"] == "1" and float(r["relative_change"]) <= 0.03 for r in published)
    assert len(_table(target, "conservation.csv")) > 0
    archived = _archived()[target]
    for row in _table(target):
        key = (
            f"experts:{row['tokens']}:{row['activated_experts']}:{row['local_assignments']}"
            if row["component"] == "experts"
            else f"{row['component']}:{row['tokens']}"
        )
        assert archived[key] == pytest.approx(float(row["time_us"]), abs=1e-9)
