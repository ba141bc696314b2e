"""The committed H200 torch-reference bundle (issue 4, item 8) is what its contract says.

Made on the H200 by `scripts/h200_torch_reference.sh` (docs/benchmarks.md, "torch-reference
backend on the H200"); these checks fail if the bundle is edited, truncated or mislabelled.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from moetables.bundle import validate_bundle
from moetables.lookup import ComponentTables

BUNDLE = (
    Path(__file__).resolve().parents[2]
    / "bundles/H200-torch-reference/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
)


def _entries() -> list[dict]:
    meta = yaml.safe_load((BUNDLE / "meta.yaml").read_text())
    return meta["per_tp"][1]["moe_components"]["entries"]


def test_it_validates_with_every_target_the_issue_names() -> None:
    report = validate_bundle(BUNDLE)
    assert report.ok, report.problems
    targets = {(e["target"]["dp"], e["target"]["rank"]) for e in _entries()}
    assert targets == {(1, 0), (2, 0), (2, 1)}


def test_contracts_name_the_backend_device_and_protocol() -> None:
    """R6/R7-style provenance: hardware, software and command travel with every table."""
    for entry in _entries():
        contract = entry["contract"]
        assert contract["backend"]["name"] == "torch-reference"
        assert contract["backend"]["device"] == "cuda"
        assert contract["provenance"]["device_name"] == "NVIDIA H200"
        assert contract["provenance"]["torch_version"].startswith("2.11.0")
        assert contract["measurement"]["rounds"] == 3
        assert contract["measurement"]["iterations"] == 3
        assert "--backend torch-reference" in contract["provenance"]["command_line"]
        coverage = entry["coverage"]
        assert coverage["complete"] is True
        assert coverage["conditioning_summary"]["failed_points"] == 0


def test_it_answers_inside_support_and_refuses_outside() -> None:
    rank0 = ComponentTables(BUNDLE).deployment(1, 2, 0)
    inside = rank0.time_us("experts", 512, 64, 2048)
    assert 0 < inside < 1e5
    assert (
        rank0.answer(
            [
                {
                    "component": "experts",
                    "tokens": 8192,
                    "activated_experts": 64,
                    "local_assignments": 32768,
                }
            ]
        )[0]["error"]
        == "out_of_support"
    )
