"""``python -m acquisition conserve`` on CPU (issue 14; R15, R26, R32-R35): conservation traces
for tables published without them, measured by rebuilding the table's backend, attached as
supplementary evidence with honest provenance, atomically, and refused where this host or the
bundle does not fit.

The tables come from a real acquisition on CPU with fake vLLM objects and no tracer (so their
bundle says its conservation is absent, as the shipped pre-session-4 bundles do); the conserve
run rebuilds the same fake path with ``vllm_fakes.trace``, the stand-in for the CUDA profiler.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import pytest
import vllm_fakes as fv
import yaml
from conserve_fakes import Admitting, acquire

from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.cli import main
from acquisition.conserve import ConserveError, plan_targets, run
from acquisition.progress import ProgressReporter
from moetables.bundle import open_bundle, validate_bundle
from moetables.bundle.model import SUPPLEMENT_KEY


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle published without conservation, as the pre-session-4 H200 tables were."""
    from tiny_moe import write_model

    root = tmp_path_factory.mktemp("conserve")
    bundle = acquire(write_model(root / "tiny", num_experts=8), root / "out", traced=False)
    for entry in open_bundle(bundle).entries:
        assert entry.quality is not None and entry.quality.conservation is None
    return bundle


@pytest.fixture
def bundle(shipped: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "bundles" / "CPU-TEST" / "bf16"
    shutil.copytree(shipped, copy)
    return copy


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _no_stage(bundle: Path) -> bool:
    """Nothing beside the bundle but itself and its writers' lock."""
    return {p.name for p in bundle.parent.iterdir()} <= {"bf16", ".bf16.meta.lock"}


def _conserve(
    bundle: Path,
    *,
    backend: VllmModularBackend | None = None,
    runtime: Any = None,
    vllm: str | None = None,
    out: Path | None = None,
    replace: bool = False,
) -> tuple[list[Path], list[str]]:
    backend = backend or Admitting()
    progress = ProgressReporter(None, bar=False, total=3)
    try:
        return run(
            plan_targets([bundle], replace=replace),
            out=out,
            replace_rows=replace,
            command_line="python -m acquisition conserve TEST",
            progress=progress,
            backend_for=lambda name: backend,
            probe=lambda device: runtime or fv.fake_runtime(),
            vllm_version=lambda: vllm,
        )
    finally:
        progress.close()


def test_it_writes_validated_rows_for_every_target(bundle: Path) -> None:
    before = _files(bundle)
    written, failures = _conserve(bundle)
    assert failures == [] and written == [bundle]
    report = validate_bundle(bundle)
    assert report.ok, report.problems
    assert len(report.quality) == 3
    for path, evidence in report.quality.items():
        assert evidence.conservation is not None, path
        # 1 row and the token budget (4): the build's own trace_tokens, from the contract
        assert [r.tokens for r in evidence.conservation] == [1, 4]
        expected = {"gate_routing", "experts"} | ({"finalize_copy"} if "dp2" in path else set())
        assert all(set(r.components_us) == expected for r in evidence.conservation)
        assert evidence.conservation_supplement is not None
    # the tables and stability files keep their bytes; only meta.yaml and three new files
    after = _files(bundle)
    changed = {k for k in before if after[k] != before[k]}
    assert changed == {"meta.yaml"}
    added = sorted(set(after) - set(before))
    assert len(added) == 3 and all(p.endswith("/conservation.csv") for p in added)


def test_the_contract_says_the_rows_were_measured_separately(bundle: Path) -> None:
    _conserve(bundle)
    meta = yaml.safe_load((bundle / "meta.yaml").read_text())
    assert meta[SUPPLEMENT_KEY]["written_by"] == "python -m acquisition conserve"
    for entry in meta["per_tp"][1]["moe_components"]["entries"]:
        ref = entry["quality"]["conservation"]
        assert ref["supplementary"] is True and ref["file"].endswith("conservation.csv")
        contract = entry["contract"]
        s = contract[SUPPLEMENT_KEY]
        assert s["measured"] == "separately from the table"
        assert s["command_line"] == "python -m acquisition conserve TEST"
        assert (
            s["device_name"] == "fake"
            and s["torch_version"] == contract["provenance"]["torch_version"]
        )
        # the table's own date stays where it was, and is named beside the traces' date
        assert s["table_measured_at"] == contract["provenance"]["started_at"]
        assert s["measured_at"] >= s["table_measured_at"]
        assert s["limits"]["max_num_batched_tokens"] == 4
        assert [f["tokens"] for f in s["launch_ownership"]] == [1, 4]
        assert s["backend_checked"]["name"] == "vllm-modular"
        # the acquisition's own backend description is untouched: no traces claimed for it
        assert not contract["backend"].get("launch_ownership")


def test_a_different_gpu_is_refused_and_the_bundle_is_kept(bundle: Path) -> None:
    before = _files(bundle)
    other = dataclasses.replace(fv.fake_runtime(), device_name="NVIDIA H100 80GB HBM3")
    backend = Admitting()
    written, failures = _conserve(bundle, runtime=other, backend=backend)
    assert written == [] and len(failures) == 1
    assert "device_name" in failures[0] and "NVIDIA H100" in failures[0]
    assert backend.built == []  # refused before anything was built
    assert _files(bundle) == before


def test_a_different_vllm_version_is_refused(bundle: Path) -> None:
    before = _files(bundle)
    written, failures = _conserve(bundle, vllm="0.27.0")
    assert written == [] and "vLLM version" in failures[0] and "0.27.0" in failures[0]
    assert _files(bundle) == before


def test_a_built_path_other_than_the_contracts_is_refused(bundle: Path) -> None:
    meta = yaml.safe_load((bundle / "meta.yaml").read_text())
    for entry in meta["per_tp"][1]["moe_components"]["entries"]:
        entry["contract"]["backend"]["expert_class"] = "vllm.somewhere.DeepGemmExperts"
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    before = _files(bundle)
    written, failures = _conserve(bundle)
    assert written == [] and "built path is not the table's" in failures[0]
    assert "DeepGemmExperts" in failures[0]
    assert _files(bundle) == before


def test_a_failure_midway_leaves_the_bundle_whole(bundle: Path) -> None:
    """DP1 and DP2 rank 0 traced, rank 1's build fails: nothing of the bundle is written and
    no staging folder is left beside it."""
    before = _files(bundle)
    backend = Admitting(fail_rank=1)
    written, failures = _conserve(bundle, backend=backend)
    assert written == [] and "the device fell over" in failures[0]
    assert backend.built == ["dp1_ep1_rank0_sp0", "dp2_ep2_rank0_sp0"]
    assert _files(bundle) == before
    assert _no_stage(bundle)


def test_a_failure_while_writing_leaves_the_bundle_whole(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import moetables.bundle.writer as writer

    def broken(*args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(writer, "_swap_in", broken)
    before = _files(bundle)
    written, failures = _conserve(bundle)
    assert written == [] and "disk full" in failures[0]
    assert _files(bundle) == before
    assert _no_stage(bundle)


def test_existing_rows_are_refused_unless_replaced(bundle: Path) -> None:
    _conserve(bundle)
    with pytest.raises(ConserveError, match="supplementary conservation rows already"):
        plan_targets([bundle])
    first = yaml.safe_load((bundle / "meta.yaml").read_text())
    written, failures = _conserve(bundle, replace=True)
    assert failures == [] and written == [bundle]
    again = yaml.safe_load((bundle / "meta.yaml").read_text())
    entry = again["per_tp"][1]["moe_components"]["entries"][0]
    assert (
        entry["contract"][SUPPLEMENT_KEY]["measured_at"]
        >= (
            first["per_tp"][1]["moe_components"]["entries"][0]["contract"][SUPPLEMENT_KEY][
                "measured_at"
            ]
        )
    )
    assert validate_bundle(bundle).ok


def test_rows_measured_with_the_table_are_never_replaced(tmp_path: Path) -> None:
    from tiny_moe import write_model

    traced = acquire(write_model(tmp_path / "tiny", num_experts=8), tmp_path / "o", traced=True)
    for replace in (False, True):
        with pytest.raises(ConserveError, match="measured with its table"):
            plan_targets([traced], replace=replace)


def test_out_writes_a_new_bundle_and_keeps_the_source(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _files(bundle)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "updated"
    written, failures = _conserve(bundle, out=out)
    assert failures == []
    relative = bundle.relative_to(tmp_path)  # OUT/<bundle as named under the working folder>
    assert written == [out / relative] and validate_bundle(out / relative).ok
    assert _files(bundle) == before
    assert len(list((out / relative).rglob("conservation.csv"))) == 3
    # an absolute path outside the working folder has no place under OUT
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    written, failures = _conserve(bundle, out=out)
    assert written == [] and "under the working folder" in failures[0]


def test_the_cli_checks_before_any_device(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conserve", "--dry-run", "--no-progress-bar", str(bundle)]) == 0
    err = capsys.readouterr().err
    assert err.count("vllm-modular") == 3 and "measured 20" in err
    assert main(["conserve", "--dry-run", str(bundle), "--target", "dp9_ep9_rank0_sp0"]) == 2
    assert "no target named" in capsys.readouterr().err


def test_a_format_1_table_is_sent_to_the_evidence_republisher(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = yaml.safe_load((bundle / "meta.yaml").read_text())
    owner = meta["per_tp"][1]["moe_components"]
    owner.pop("format_version")
    for entry in owner["entries"]:
        entry.pop("quality")
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    assert main(["conserve", "--dry-run", str(bundle)]) == 2
    assert "python -m acquisition.evidence" in capsys.readouterr().err


# -- the reader's side (R30-R35): the mark is checked both ways ----------------------------------


def test_the_reader_refuses_an_unmarked_or_unexplained_supplement(bundle: Path) -> None:
    _conserve(bundle)
    meta = yaml.safe_load((bundle / "meta.yaml").read_text())
    entry = meta["per_tp"][1]["moe_components"]["entries"][0]
    entry["quality"]["conservation"].pop("supplementary")
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    report = validate_bundle(bundle)
    assert not report.ok and "supplementary" in " ".join(report.problems)
    entry["quality"]["conservation"]["supplementary"] = True
    del entry["contract"][SUPPLEMENT_KEY]["measured_at"]
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    report = validate_bundle(bundle)
    assert not report.ok and "measured_at" in " ".join(report.problems)


# -- the path identity check against the shipped contracts ---------------------------------------

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [
    f"bundles/{root}/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
    for root in (
        "H200",
        "H200-torch-reference",
        "H200-vllm-modular-f2",
        "H200-vllm-modular-dp4-f4",
        "H200-vllm-modular-dp8-f4",
    )
]


@pytest.mark.parametrize("path", SHIPPED)
def test_the_shipped_tables_plan_and_their_own_description_passes(path: str) -> None:
    """Every shipped table without traces is accepted by the planner (21 in all), and the
    identity check reads its contract's description whatever its shape (the torch reference
    states its layout in words), finding a changed class or layout."""
    from acquisition.conserve import identity_mismatches

    # replace=True: the same 21 targets plan before and after their traces are attached
    targets = plan_targets([REPO / path], replace=True)
    assert targets and all(t.provenance["device_name"] == "NVIDIA H200" for t in targets)
    for target in targets:
        backend = target.contract["backend"]
        assert identity_mismatches(backend, backend) == []
        changed = {**backend, "native": not backend["native"]}
        assert identity_mismatches(backend, changed) != []
        layout = backend["expert_layout"]
        if isinstance(layout, dict):
            other = {**layout, "w13": {"shape": [1, 2, 3]}}
        else:
            other = layout + ", other"
        assert identity_mismatches(backend, {**backend, "expert_layout": other}) != []


def test_all_shipped_h200_targets_without_traces_are_planned() -> None:
    assert sum(len(plan_targets([REPO / p], replace=True)) for p in SHIPPED) == 21
