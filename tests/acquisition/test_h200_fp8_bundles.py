"""The committed H200 FP8 bundles (issue 20, item 4) are what their contracts and docs say.

Measured on one H200 on 2026-12-01 by `scripts/h200_fp8.sh` (docs/h200-runs.md, "FP8 on one
H200"); these checks fail if a bundle is edited, truncated or mislabelled, or if the record of
which kernels ran (the Triton path, DeepGEMM off for DP+EP) stops being true.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from moetables.bundle import validate_bundle
from moetables.errors import CoverageError
from moetables.lookup import ComponentTables

ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8"
MODULAR = ROOT / "bundles/H200-vllm-modular-fp8-f2" / MODEL / "fp8"
LIVE = ROOT / "bundles/H200-vllm-live-fp8-f2" / MODEL / "fp8"


def _entries(root: Path) -> list[dict[str, Any]]:
    meta = yaml.safe_load((root / "meta.yaml").read_text())
    entries: list[dict[str, Any]] = meta["per_tp"][1]["moe_components"]["entries"]
    return entries


@pytest.mark.parametrize(
    ("root", "targets", "rows"),
    [(MODULAR, {(1, 0), (2, 0), (2, 1)}, 1450), (LIVE, {(1, 0)}, 68)],
)
def test_it_validates_with_the_targets_and_rows_the_docs_give(
    root: Path, targets: set[tuple[int, int]], rows: int
) -> None:
    report = validate_bundle(root)
    assert report.ok, report.problems
    assert {(e["target"]["dp"], e["target"]["rank"]) for e in _entries(root)} == targets
    assert sum(e["coverage"]["points"] for e in _entries(root)) == rows


@pytest.mark.parametrize("root", [MODULAR, LIVE])
def test_contracts_record_fp8_weights_the_device_and_a_complete_passing_table(root: Path) -> None:
    for entry in _entries(root):
        contract = entry["contract"]
        assert contract["backend"]["dtypes"]["expert_weights"] == "float8_e4m3fn"
        assert contract["backend"]["quantization"]["weight_block_shape"] == [128, 128]
        assert contract["provenance"]["device_name"] == "NVIDIA H200"
        assert MODEL in contract["provenance"]["command_line"]
        assert entry["coverage"]["complete"] is True
        assert entry["coverage"]["conditioning_summary"]["failed_points"] == 0


def test_every_modular_target_ran_triton_and_dp2_declined_deepgemm() -> None:
    """The Triton path (docs/acquisition.md): DP1 by vLLM's priority, DP2/EP2 because the run
    set VLLM_USE_DEEP_GEMM=0 (the kit lacks DeepGEMM's JIT headers). The recorded reason is
    vLLM's own, misleading one; later runs name the switch (test_vllm_modular_fp8.py)."""
    for entry in _entries(MODULAR):
        oracle = entry["contract"]["backend"]["quantization"]["oracle"]
        assert oracle["selected"] == "TRITON"
        assert oracle["experts_class"].endswith("triton_moe.TritonExperts")
        declined = {d["backend"] for d in oracle["declined_before_selection"]}
        if entry["target"]["dp"] == 1:
            assert declined == set()
        else:
            assert "DEEPGEMM" in declined
            components = set(entry["contract"]["components"])
            assert "dispatch_quant" in components


def test_the_live_engine_ran_triton_experts() -> None:
    backend = _entries(LIVE)[0]["contract"]["backend"]
    assert backend["native_backend"] == "TRITON"
    assert backend["expert_class"].endswith("triton_moe.TritonExperts")


@pytest.mark.parametrize("root", [MODULAR, LIVE])
def test_the_samples_archive_keeps_the_checkpoint_without_writer_locks(root: Path) -> None:
    with tarfile.open(root.parent / "fp8.acquisition-samples.tar.gz") as packed:
        names = packed.getnames()
    assert not any(n.endswith(".lock") for n in names)
    samples = [n for n in names if n.endswith("samples.jsonl") and "/_acquisition/" in n]
    assert len(samples) == len(_entries(root))
    assert any(n.endswith("progress.jsonl") for n in names)
    assert any(n.endswith("phases.jsonl") for n in names)
    if root == MODULAR:
        # The DP1 table of call 9 (switch unset) was replaced in session 5; its samples, plan,
        # table and contract stay in the archive as the record of the superseded path.
        assert "./call9-meta.yaml" in names and "./fp8_probe.json" in names
        assert "./superseded-dp1-call9/samples.jsonl" in names
        assert "./superseded-dp1-call9/components.csv" in names


def test_it_answers_inside_support_and_refuses_outside() -> None:
    rank0 = ComponentTables(MODULAR).deployment(1, 2, 0)
    assert 0 < rank0.time_us("experts", 512, 32, 2048) < 1e5
    assert 0 < rank0.time_us("dispatch_quant", 512) < 1e4  # a local component: N only
    with pytest.raises(CoverageError):
        rank0.time_us("experts", 8192, 64, 65536)  # beyond the largest measured N


def test_the_three_modular_tables_are_one_path() -> None:
    """Issue 20 item 4: the DP1 table was re-measured in session 5 under VLLM_USE_DEEP_GEMM=0
    (the switch the DP2 ranks ran with) and moved in by the bundle writer; its own contract now
    records the switch and the fused activation quantization its kernels ran."""
    meta = yaml.safe_load((MODULAR / "meta.yaml").read_text())
    entries = _entries(MODULAR)
    dp1 = next(e for e in entries if e["target"]["dp"] == 1)
    oracle = dp1["contract"]["backend"]["quantization"]["oracle"]
    assert oracle["environment"] == {"VLLM_USE_DEEP_GEMM": "0"}
    assert "--moe-kernel-steps off" in dp1["contract"]["provenance"]["command_line"]
    for entry in entries:
        assert "silu_and_mul_per_block_quant_kernel" in yaml.safe_dump(entry["contract"])
    plans = {e["contract"]["expert_sampling"]["point_plan_sha256"] for e in entries if e is dp1}
    assert plans == {"0909ae9ece1cec685b4bf8f99e9ba8fdaf674897ccc27d845bd0900a86ae6dc8"}
    (moved,) = meta["transplanted"]
    assert moved["deployment"] == "tp1/dp1_ep1_rank0_sp0"
    assert moved["table_sha256"] == dp1["coverage"]["table_sha256"]
    assert moved["replaced_table_sha256"] != moved["table_sha256"]
