"""Load-spread evidence of any catalog model (issue 18): a cost is recorded only on tables whose
expert kernel has the shape the evidence timed, and the GPU script takes its geometry from the
catalog (R29: the shape, never the model's name, decides; R43: a mismatch is an error)."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from acquisition.catalog import resolve_model
from acquisition.load_spread import (
    LEGACY_MODEL,
    LoadSpreadError,
    attach,
    evidence_model,
    geometry_record,
    main,
    measured_deployments,
    merged,
    table_dp,
)

ROOT = Path(__file__).resolve().parents[2]
OLMOE = ROOT / "bundles/H200-vllm-modular-f2k4/allenai/OLMoE-1B-7B-0924/bf16"
OLMOE_DP2 = ROOT / "bundles/H200-vllm-modular-dp2-f4/allenai/OLMoE-1B-7B-0924/bf16"
LEGACY = json.loads((ROOT / "docs/evidence/h200-load-spread/load_spread.json").read_text())


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "h200_load_spread", ROOT / "scripts/h200_load_spread.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _as_model(raw: dict[str, Any], name: str, deployment_map: dict[str, str]) -> dict[str, Any]:
    """The legacy records relabelled as another model's timing (its geometry in ``meta``)."""
    m = resolve_model(name)
    out = copy.deepcopy(raw)
    out["meta"]["model"] = geometry_record(m)
    out["results"] = [
        {**r, "deployment": deployment_map[r["deployment"]]}
        for r in out["results"]
        if r["deployment"] in deployment_map
    ]
    return out


def test_deployments_name_the_ep_size_of_their_tables() -> None:
    assert [table_dp(d) for d in ("tp1", "ep2", "ep4", "ep8", "ep16")] == [1, 2, 4, 8, 16]
    for bad in ("ep1", "ep", "tp2", "epx", "dp2"):
        with pytest.raises(LoadSpreadError, match="unknown deployment"):
            table_dp(bad)
    raw = {"results": [{"deployment": d} for d in ("ep8", "tp1", "ep16", "ep2")]}
    assert measured_deployments(raw) == ["tp1", "ep2", "ep8", "ep16"]


def test_files_without_a_model_are_the_qwen3_30b_runs_they_were() -> None:
    assert "model" not in LEGACY["meta"]
    assert evidence_model(LEGACY) == LEGACY_MODEL
    q = resolve_model(str(LEGACY_MODEL["name"]))
    assert (q.global_experts, q.top_k, q.hidden_size, q.expert_intermediate_size) == (
        128,
        8,
        2048,
        768,
    )


def test_qwen3_30b_evidence_is_refused_on_olmoe_tables_naming_the_shape(tmp_path: Path) -> None:
    bundle = tmp_path / "bf16"
    shutil.copytree(OLMOE, bundle)
    before = {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    with pytest.raises(LoadSpreadError) as err:
        attach(bundle, LEGACY, ["tp1"])
    message = str(err.value)
    assert "Qwen/Qwen3-30B-A3B-Instruct-2507" in message
    assert "global_experts 128 (table: 64)" in message
    assert "expert_intermediate_size 768 (table: 1024)" in message
    # Nothing half-written.
    assert {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()} == before


def test_records_of_another_expert_count_than_the_rank_holds_are_refused(tmp_path: Path) -> None:
    """OLMoE's geometry claimed, but the records timed 64 local experts: its DP2 ranks hold 32."""
    bundle = tmp_path / "bf16"
    shutil.copytree(OLMOE_DP2, bundle)
    raw = _as_model(LEGACY, "allenai/OLMoE-1B-7B-0924", {"ep2": "ep2"})
    with pytest.raises(LoadSpreadError, match=r"time \[64\] local experts; 64 experts over 2"):
        attach(bundle, raw, ["ep2"])
    raw["meta"]["model"]["global_experts"] = 128
    with pytest.raises(LoadSpreadError, match=r"local experts 64 \(table: 32\)"):
        attach(bundle, raw, ["ep2"])


def test_files_of_two_geometries_do_not_merge() -> None:
    olmoe = _as_model(LEGACY, "allenai/OLMoE-1B-7B-0924", {"tp1": "tp1"})
    with pytest.raises(LoadSpreadError, match="different MoE geometries"):
        merged([LEGACY, olmoe])
    both = merged([olmoe, olmoe])
    assert both["meta"]["model"]["name"] == "allenai/OLMoE-1B-7B-0924"
    assert len(both["results"]) == 2 * len(olmoe["results"])


def test_the_cli_names_the_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = tmp_path / "bf16"
    shutil.copytree(OLMOE, bundle)
    evidence = ROOT / "docs/evidence/h200-load-spread/load_spread.json"
    with pytest.raises(SystemExit) as exit_:
        main([str(bundle), str(evidence), "--deployments", "tp1"])
    assert exit_.value.code == 2
    assert "another shape" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(bundle), str(evidence), "--deployments", "ep1"])
    assert "unknown deployment 'ep1'" in capsys.readouterr().err


def test_the_gpu_script_maps_deployments_to_local_experts() -> None:
    script = _script()
    assert script.local_experts("tp1", 64) == 64
    assert script.local_experts("ep2", 64) == 32
    assert script.local_experts("ep8", 128) == 16
    with pytest.raises(ValueError, match="do not divide"):
        script.local_experts("ep3", 64)
    with pytest.raises(ValueError, match="unknown deployment"):
        script.local_experts("ep1", 64)


def test_the_gpu_script_refuses_an_unknown_deployment_before_touching_a_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = _script()
    with pytest.raises(SystemExit):
        script.main(
            [
                str(tmp_path / "x.json"),
                "--model",
                "allenai/OLMoE-1B-7B-0924",
                "--deployments",
                "ep3",
            ]
        )
    assert "64 experts do not divide over 3 ranks" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
