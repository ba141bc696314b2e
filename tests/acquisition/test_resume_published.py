"""A resume starts only unfinished targets (R9, issue 19; acquisition/finished.py).

A rerun of the same command after one target failed (its B/2B points, a kill, a time limit)
admits, builds and starts processes only for the targets not yet published; a published one
is skipped from its marker, its checkpoint's digest and the bundle's entry, and counts as
resumed so that progress and ETA stay exact. Whatever changed (a condition, the checkpoint,
the bundle) sends the target down the full path again. CPU, torch-reference, the tiny model.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_target_isolation import (
    DEPLOYMENTS,
    argv,
    bundle_of,
    events,
    run_child,
    sample_records,
    tables,
    work_of,
)

from acquisition.cli import _isolated, build_parser, main, prepare
from acquisition.finished import MARKER, finished_target

pytest.importorskip("torch")


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Admissions and builds by deployment, through the real backend."""
    import acquisition.adapters as adapters
    from acquisition.adapters.torch_reference import TorchReferenceBackend

    seen: dict[str, list[str]] = {"admitted": [], "built": []}
    select, build = adapters.select_backend, TorchReferenceBackend.build

    def counted_select(name: str, model: Any, target: Any, runtime: Any) -> Any:
        seen["admitted"].append(target.deployment)
        return select(name, model, target, runtime)

    def counted_build(self: Any, model: Any, target: Any, *args: Any) -> Any:
        seen["built"].append(target.deployment)
        return build(self, model, target, *args)

    monkeypatch.setattr(adapters, "select_backend", counted_select)
    monkeypatch.setattr(TorchReferenceBackend, "build", counted_build)
    return seen


def _plans(model: Path, out: Path, *extra: str) -> tuple[Any, Any]:
    args = argv(model, out, *extra)
    return prepare(build_parser().parse_args(args), args)


def test_a_rerun_of_a_published_command_admits_and_builds_nothing(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R9: every target published, the same command again: no admission, no build, no new
    session in any checkpoint, the same bundle bytes, and progress ends at its total."""
    out = tmp_path / "out"
    assert main(argv(tiny_model, out, "--isolate-targets", "off")) == 0
    for deployment in DEPLOYMENTS:
        marker = json.loads((work_of(out, deployment) / MARKER).read_text())
        assert marker["points"] > 0 and marker["backend"] == "torch-reference"
    before = {p: p.read_bytes() for p in bundle_of(out).rglob("*") if p.is_file()}
    samples = {d: (work_of(out, d) / "samples.jsonl").read_bytes() for d in DEPLOYMENTS}
    seen = _count_builds(monkeypatch)
    progress = tmp_path / "progress.jsonl"
    assert main(argv(tiny_model, out, "--progress-json", str(progress))) == 0
    assert seen == {"admitted": [], "built": []}
    assert {p: p.read_bytes() for p in bundle_of(out).rglob("*") if p.is_file()} == before
    for deployment in DEPLOYMENTS:
        assert (work_of(out, deployment) / "samples.jsonl").read_bytes() == samples[deployment]
    log = events(progress)
    resumed = [e for e in log if e["message"].startswith("resumed:")]
    assert [e["target"] for e in resumed] == [f"tp1/{d}" for d in DEPLOYMENTS]
    assert log[-1]["phase"] == "done"
    total = sum(len(rows) for rows in tables(out).values())
    assert log[-1]["points_done"] == log[-1]["points_total"] == total


def test_a_resume_builds_only_the_unfinished_target_and_counts_exactly(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One target published (here by --ranks 0), the other not: the rerun admits and builds
    the other only; the published one keeps its checkpoint bytes and table; points done
    reach the total, with the skipped target's points counted as resumed, not measured."""
    out = tmp_path / "out"
    assert main(argv(tiny_model, out, "--ranks", "0")) == 0
    first = tables(out)[DEPLOYMENTS[0]]
    samples0 = (work_of(out, DEPLOYMENTS[0]) / "samples.jsonl").read_bytes()
    seen = _count_builds(monkeypatch)
    progress = tmp_path / "progress.jsonl"
    assert main(argv(tiny_model, out, "--progress-json", str(progress))) == 0
    assert seen == {"admitted": [DEPLOYMENTS[1]], "built": [DEPLOYMENTS[1]]}
    assert (work_of(out, DEPLOYMENTS[0]) / "samples.jsonl").read_bytes() == samples0
    final = tables(out)
    assert sorted(final) == DEPLOYMENTS and final[DEPLOYMENTS[0]] == first
    log = events(progress)
    resumed = [e for e in log if e["message"].startswith("resumed:")]
    assert len(resumed) == 1 and resumed[0]["target"] == f"tp1/{DEPLOYMENTS[0]}"
    assert resumed[0]["points_done"] == len(first)
    # The ETA is known only once a point was measured in this run: none from the skip.
    assert resumed[0]["eta_s"] is None
    assert log[-1]["phase"] == "done"
    assert (
        log[-1]["points_done"] == log[-1]["points_total"] == len(first) + len(final[DEPLOYMENTS[1]])
    )


def test_anything_changed_sends_the_target_down_the_full_path(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The skip is only a shortcut of a no-op resume: a changed condition, checkpoint or
    bundle entry, or a missing marker, makes `finished_target` say no."""
    out = tmp_path / "out"
    assert main(argv(tiny_model, out, "--isolate-targets", "off")) == 0
    request, plans = _plans(tiny_model, out)
    assert all(finished_target(request, plan) is not None for plan in plans)
    done = finished_target(request, plans[0])
    assert done is not None and done.points == len(tables(out)[DEPLOYMENTS[0]])
    # Another protocol condition (the same one the checkpoint identity refuses).
    other, other_plans = _plans(tiny_model, out, "--quality-tolerance", "0.5")
    assert finished_target(other, other_plans[0]) is None
    # Another grid: another requested plan.
    other, other_plans = _plans(tiny_model, out, "--moe-grid-factor", "4")
    assert finished_target(other, other_plans[0]) is None
    # The checkpoint grew after publication (a session the bundle does not reflect).
    samples = work_of(out, DEPLOYMENTS[0]) / "samples.jsonl"
    kept = samples.read_bytes()
    samples.write_bytes(kept + kept.splitlines(keepends=True)[0])
    assert finished_target(request, plans[0]) is None
    samples.write_bytes(kept)
    assert finished_target(request, plans[0]) is not None
    # The table's bytes no longer what the entry says.
    marker = json.loads((work_of(out, DEPLOYMENTS[1]) / MARKER).read_text())
    table = bundle_of(out) / "tp1" / marker["table"]
    table_bytes = table.read_bytes()
    table.write_bytes(table_bytes + b"\n")
    assert finished_target(request, plans[1]) is None
    table.write_bytes(table_bytes)
    assert finished_target(request, plans[1]) is not None
    # No marker: the full path (which re-publishes and writes it again).
    (work_of(out, DEPLOYMENTS[0]) / MARKER).unlink()
    assert finished_target(request, plans[0]) is None
    assert main(argv(tiny_model, out, "--isolate-targets", "off")) == 0
    assert finished_target(request, plans[0]) is not None
    # The bundle gone: both targets are measured into a new one from their checkpoints.
    shutil.rmtree(bundle_of(out))
    assert all(finished_target(request, plan) is None for plan in plans)
    assert main(argv(tiny_model, out, "--isolate-targets", "off")) == 0
    assert sorted(tables(out)) == DEPLOYMENTS


def test_an_isolated_resume_starts_children_only_for_unfinished_targets(
    tiny_model: Path, tmp_path: Path
) -> None:
    """With --isolate-targets on, the parent skips a published target itself (no child, no
    session added to its checkpoint) and starts one child per unfinished target."""
    out, phases = tmp_path / "out", tmp_path / "phases.jsonl"
    assert main(argv(tiny_model, out, "--ranks", "0")) == 0
    progress = tmp_path / "progress.jsonl"
    wider = ["--dp", "1,2", "--isolate-targets", "on", "--progress-json", str(progress)]
    result = run_child(argv(tiny_model, out, *wider, "--phase-log", str(phases)))
    assert result.returncode == 0, result.stderr
    records = events(phases)
    children = [r for r in records if "--only-target" in r["command_line"]]
    started = sorted(r["command_line"].split("--only-target ")[1].split()[0] for r in children)
    assert started == ["tp1/dp1_ep1_rank0_sp0", f"tp1/{DEPLOYMENTS[1]}"]
    assert len(records) == 3 and records[-1] not in children
    assert len(sample_records(out, DEPLOYMENTS[0], "session")) == 1
    log = events(progress)
    assert log[-1]["phase"] == "done"
    assert log[-1]["points_done"] == log[-1]["points_total"] == records[-1]["points_done"]
    assert log[-1]["points_total"] == sum(len(rows) for rows in tables(out).values())
    # The children's markers are read as the command's own: the same command skips all three.
    request, plans = _plans(tiny_model, out, *wider[:4])
    assert len(plans) == 3 and all(finished_target(request, p) is not None for p in plans)


def test_the_last_unfinished_target_runs_in_the_command_s_own_process(
    tiny_model: Path, tmp_path: Path
) -> None:
    """One target left: it runs in the command's process, which is as fresh as a child would
    be (a child would be a second start for the same isolation)."""
    out, phases = tmp_path / "out", tmp_path / "phases.jsonl"
    assert main(argv(tiny_model, out, "--ranks", "0")) == 0
    result = run_child(argv(tiny_model, out, "--isolate-targets", "on", "--phase-log", str(phases)))
    assert result.returncode == 0, result.stderr
    records = events(phases)
    assert len(records) == 1 and "--only-target" not in records[0]["command_line"]
    assert set(records[0]["targets"]) - {"run"} == {f"tp1/{DEPLOYMENTS[1]}"}
    assert len(sample_records(out, DEPLOYMENTS[0], "session")) == 1
    assert records[0]["points_done"] == records[0]["points_total"]
    assert sorted(tables(out)) == DEPLOYMENTS


def _args(backend: str, device: str = "cuda", isolate: str = "auto") -> argparse.Namespace:
    return argparse.Namespace(
        only_target=None, isolate_targets=isolate, backend=backend, device=device
    )


def test_auto_shares_one_process_for_modular_targets_and_isolates_live() -> None:
    """`--isolate-targets auto`: one process for vllm-modular and torch-reference targets
    (docs/h200-runs.md "Rank drift": no process drift), a child per target for vllm-live and
    for auto (which may admit vllm-live) on CUDA; on/off are obeyed; one target never forks."""
    two, one = [object(), object()], [object()]
    assert not _isolated(_args("vllm-modular"), two)  # type: ignore[arg-type]
    assert not _isolated(_args("torch-reference"), two)  # type: ignore[arg-type]
    assert _isolated(_args("vllm-live"), two)  # type: ignore[arg-type]
    assert _isolated(_args("auto"), two)  # type: ignore[arg-type]
    assert not _isolated(_args("vllm-live", device="cpu"), two)  # type: ignore[arg-type]
    assert _isolated(_args("vllm-modular", isolate="on"), two)  # type: ignore[arg-type]
    assert not _isolated(_args("vllm-live", isolate="off"), two)  # type: ignore[arg-type]
    assert not _isolated(_args("vllm-live"), one)  # type: ignore[arg-type]
