"""Target isolation and the rank filter on CPU (R6, R7, R9, R35; docs/acquisition.md).

In one acquisition process, DP8 ranks measured later were systematically slower than the same
ranks measured by a fresh process (docs/h200-runs.md, "Wider expert parallelism on one GPU").
So: a finished target's session, banks and weights are released before the next target builds;
``--isolate-targets on`` runs each target in a child process that resumes the same checkpoint
and publishes into the same bundle; ``--ranks`` measures only some EP ranks, and a later run
adds the others. Tiny geometry (4 experts, top-2) keeps the file at seconds.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
from tiny_moe import write_model

from acquisition.cli import build_parser, main, prepare
from acquisition.options import OptionError
from moetables.bundle import validate_bundle

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
COMMON = [
    "--hardware",
    "CPU",
    "--tp",
    "1",
    "--tp-refresh",
    "1",
    "--dp",
    "2",
    "--max-num-seqs",
    "2",
    "--max-num-batched-tokens",
    "2",
    "--moe-rounds",
    "2",
    "--measurement-iterations",
    "1",
    "--warmup-cycles",
    "0",
    "--backend",
    "torch-reference",
    "--device",
    "cpu",
    "--cache-bytes",
    "1",
    "--quality-tolerance",
    "0.9",
    "--cudagraph-mode",
    "NONE",
    "--no-progress-bar",
]
DEPLOYMENTS = ["dp2_ep2_rank0_sp0", "dp2_ep2_rank1_sp0"]


def argv(model: Path, out: Path, *extra: str) -> list[str]:
    return ["slice", str(model), *COMMON, "--out-root", str(out), *extra]


def run_child(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "acquisition", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def bundle_of(out: Path) -> Path:
    return out / "CPU" / "test" / "tiny-moe" / "fp32"


def work_of(out: Path, deployment: str) -> Path:
    return out / "_acquisition/CPU/test/tiny-moe/fp32/tp1/moe_components" / deployment


def tables(out: Path) -> dict[str, dict[tuple[str, int, int, int], float]]:
    """Each published target's table: its points and times, by deployment."""
    report = validate_bundle(bundle_of(out))
    assert report.ok, report.problems
    assert report.bundle is not None
    found = {}
    for entry in report.bundle.entries:
        rows = {}
        lines = (bundle_of(out) / entry.table_path).read_text().splitlines()
        for line in lines[1:]:
            c, _, n, a, m, t = line.split(",")
            rows[(c, int(n), int(a), int(m))] = float(t)
        found[entry.target.deployment] = rows
    return found


def sample_records(out: Path, deployment: str, kind: str) -> list[dict[str, Any]]:
    path = work_of(out, deployment) / "samples.jsonl"
    lines = path.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("type") == kind]


def options_error(model: Path, tmp_path: Path, *extra: str) -> OptionError:
    args = argv(model, tmp_path / "out", *extra)
    with pytest.raises(OptionError) as caught:
        prepare(build_parser().parse_args(args), args)
    return caught.value


# -- the rank filter: checked before anything is built ---------------------------------------


def test_it_selects_only_the_named_ranks_without_adding_deployments(
    tiny_model: Path, tmp_path: Path
) -> None:
    """R7: --ranks filters the selected TP x DP ranks; it never adds TP, DP or EP degrees."""
    args = argv(tiny_model, tmp_path / "out", "--ranks", "1")
    _, plans = prepare(build_parser().parse_args(args), args)
    assert [p.target.deployment for p in plans] == ["dp2_ep2_rank1_sp0"]
    args = argv(tiny_model, tmp_path / "out", "--dp", "1,2", "--ranks", "0")
    _, plans = prepare(build_parser().parse_args(args), args)
    assert [p.target.deployment for p in plans] == ["dp1_ep1_rank0_sp0", "dp2_ep2_rank0_sp0"]


def test_it_rejects_unknown_or_repeated_ranks_naming_the_field(
    tiny_model: Path, tmp_path: Path
) -> None:
    """R6: a rank no selected deployment has is an OptionError on `ranks`, before any engine."""
    error = options_error(tiny_model, tmp_path, "--ranks", "2")
    assert error.field == "ranks" and "[2]" in error.message and "[2]" in error.message
    assert "EP degrees [2]" in error.message
    assert options_error(tiny_model, tmp_path, "--ranks", "1,1").field == "ranks"
    error = options_error(tiny_model, tmp_path, "--only-target", "tp1/dp8_ep8_rank7_sp0")
    assert error.field == "only_target"
    with pytest.raises(SystemExit):  # a negative rank fails the parser's type check
        build_parser().parse_args(argv(tiny_model, tmp_path / "out", "--ranks", "-1"))


def test_a_job_validates_ranks_as_the_cli_does() -> None:
    from acquisition.options import OptionErrors, validate_job

    params = {"model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "hardware": "H200", "dp": [8]}
    assert validate_job({**params, "ranks": [0, 7]})["ranks"] == [0, 7]
    assert validate_job(params)["isolate_targets"] == "auto"
    with pytest.raises(OptionErrors) as caught:
        validate_job({**params, "ranks": [8]})
    assert set(caught.value.errors) == {"ranks"}


# -- release between targets -------------------------------------------------------------------


def test_it_releases_the_previous_targets_session_and_banks_before_the_next_build(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a target held (its session, weights and weight banks) is gone when the next
    target builds: weak references to them are dead, whatever cycles the session had."""
    from acquisition.adapters.torch_reference import TorchReferenceBackend

    sessions: list[weakref.ref[Any]] = []
    banks: list[weakref.ref[Any]] = []
    alive_at_build: list[int] = []
    build = TorchReferenceBackend.build

    def tracked_build(self: Any, *args: Any) -> Any:
        alive_at_build.append(sum(r() is not None for r in sessions + banks))
        session = build(self, *args)
        # A reference cycle, as closures and exit stacks make in the vLLM sessions: only the
        # cyclic collector frees it, so the release must not rely on reference counts.
        session.cycle = session
        allocate = session.allocate_banks

        def tracked_allocate(count: int) -> None:
            allocate(count)
            banks.extend(weakref.ref(tensor) for pair in session.banks for tensor in pair)

        session.allocate_banks = tracked_allocate
        sessions.append(weakref.ref(session))
        return session

    monkeypatch.setattr(TorchReferenceBackend, "build", tracked_build)
    gc.disable()  # the collector must not run by chance between the targets
    try:
        assert main(argv(tiny_model, tmp_path / "out", "--isolate-targets", "off")) == 0
    finally:
        gc.enable()
    assert len(sessions) == 2 and banks
    assert alive_at_build == [0, 0]
    assert all(r() is None for r in sessions + banks)


# -- isolation: the same bundle and resume semantics as one process ---------------------------


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One command in one process, the same command isolated, and a rank-filtered run that
    an isolated run later completes."""
    root = tmp_path_factory.mktemp("isolation")
    model = write_model(root / "tiny-moe")
    single, whole, partial = root / "single", root / "isolated", root / "partial"
    assert main(argv(model, single, "--isolate-targets", "off")) == 0
    progress, phases = root / "progress.jsonl", root / "phases.jsonl"
    result = run_child(
        argv(
            model,
            whole,
            "--isolate-targets",
            "on",
            "--progress-json",
            str(progress),
            "--phase-log",
            str(phases),
        )
    )
    assert main(argv(model, partial, "--ranks", "0", "--isolate-targets", "off")) == 0
    after_rank0 = tables(partial)
    rank0_forwards = len(sample_records(partial, DEPLOYMENTS[0], "forward"))
    partial_progress = root / "partial-progress.jsonl"
    completed = run_child(
        argv(model, partial, "--isolate-targets", "on", "--progress-json", str(partial_progress))
    )
    return {
        "single": single,
        "whole": whole,
        "partial": partial,
        "result": result,
        "completed": completed,
        "progress": progress,
        "partial_progress": partial_progress,
        "phases": phases,
        "after_rank0": after_rank0,
        "rank0_forwards": rank0_forwards,
    }


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_isolated_run_publishes_the_same_bundle_as_one_process(
    isolated: dict[str, Any],
) -> None:
    """Every target is published, with the same points; times agree up to CPU noise only."""
    result = isolated["result"]
    assert result.returncode == 0, result.stderr
    single, whole = tables(isolated["single"]), tables(isolated["whole"])
    assert sorted(whole) == sorted(single) == DEPLOYMENTS
    for deployment in DEPLOYMENTS:
        assert sorted(whole[deployment]) == sorted(single[deployment])
        assert all(t > 0 for t in whole[deployment].values())
    meta = (bundle_of(isolated["whole"]) / "meta.yaml").read_text()
    for deployment in DEPLOYMENTS:
        assert deployment in meta
    # Each target was measured by its own process: one session per checkpoint.
    for deployment in DEPLOYMENTS:
        sessions = sample_records(isolated["whole"], deployment, "session")
        assert len(sessions) == 1
        assert "--only-target" in sessions[0]["observations"]["command_line"]


def test_an_isolated_run_reports_one_progress_and_a_phase_record_per_process(
    isolated: dict[str, Any],
) -> None:
    """The parent relays its children's progress: points count up to one total, and the
    phase log holds each child's record plus the parent's (its wait is `isolated_target`)."""
    progress = events(isolated["progress"])
    done = [e for e in progress if e["phase"] == "done"]
    assert len(done) == 1 and done[0] is progress[-1]
    assert done[0]["points_done"] == done[0]["points_total"] > 0
    assert done[0]["bundle"] == str(bundle_of(isolated["whole"]))
    counts = [e["points_done"] for e in progress]
    assert counts == sorted(counts)
    assert {e["target"] for e in progress if e["phase"] == "measure"} == {
        f"tp1/{d}" for d in DEPLOYMENTS
    }
    records = events(isolated["phases"])
    assert len(records) == 3
    parent = records[-1]
    assert "--only-target" not in parent["command_line"]
    assert parent["exit_status"] == 0 and parent["points_done"] == done[0]["points_total"]
    assert any("isolated_target" in t["seconds"] for t in parent["targets"].values())
    children = [r for r in records[:-1] if "--only-target" in r["command_line"]]
    assert len(children) == 2 and all(r["exit_status"] == 0 for r in children)


def test_a_rank_filtered_run_is_completed_by_a_later_isolated_run(
    isolated: dict[str, Any],
) -> None:
    """R9: --ranks 0 publishes rank 0 only; the later run without --ranks resumes rank 0
    (nothing measured again) and adds rank 1 into the same bundle."""
    assert sorted(isolated["after_rank0"]) == DEPLOYMENTS[:1]
    completed = isolated["completed"]
    assert completed.returncode == 0, completed.stderr
    final = tables(isolated["partial"])
    assert sorted(final) == DEPLOYMENTS
    assert final[DEPLOYMENTS[0]] == isolated["after_rank0"][DEPLOYMENTS[0]]
    forwards = len(sample_records(isolated["partial"], DEPLOYMENTS[0], "forward"))
    assert forwards == isolated["rank0_forwards"]
    progress = events(isolated["partial_progress"])
    resumed = [e for e in progress if e["message"].startswith("resumed:")]
    assert resumed and resumed[0]["target"] == f"tp1/{DEPLOYMENTS[0]}"
    assert progress[-1]["phase"] == "done"
    assert progress[-1]["points_done"] == progress[-1]["points_total"]


def test_the_drift_bench_compares_ranks_within_and_across_runs(isolated: dict[str, Any]) -> None:
    """bench/rank_drift.py (the GPU check's comparison) on the CPU bundles: every point of
    each rank is common to both runs, and the signed bands are finite numbers."""
    sys.path.insert(0, str(REPO / "bench"))
    from rank_drift import drift

    runs = {"one-process": bundle_of(isolated["single"]), "isolated": bundle_of(isolated["whole"])}
    result = drift(runs, 2, [0, 1])
    assert set(result["within"]) == set(runs)
    for within in result["within"].values():
        assert set(within["order"]) == {"rank1"}
        assert within["agreement"]["rank1_vs_rank0"]["only_rank0"] == 0
    across = result["across"]["isolated_vs_one-process"]
    single = tables(isolated["single"])
    for rank, deployment in enumerate(DEPLOYMENTS):
        entry = across[f"rank{rank}"]
        assert entry["agreement"]["common_points"] == len(single[deployment])
        assert entry["agreement"]["only_rank0"] == entry["agreement"]["only_this_rank"] == 0
        assert all(abs(v) < 10 for v in entry["order"].values())


def test_the_modular_adapters_sessions_are_released_between_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vllm-modular session (fake vLLM APIs, CPU) of a finished target, with its kernel,
    weights and banks, is gone before the next target builds, without help from the test."""
    import vllm_fakes as fv

    from acquisition.acquire import acquire_target
    from acquisition.adapters import AdmissionReport
    from acquisition.adapters.base import Admission
    from acquisition.adapters.vllm_modular_backend import VllmModularBackend
    from acquisition.progress import ProgressReporter

    model = write_model(tmp_path / "tiny", num_experts=8)
    args = argv(model, tmp_path / "out", "--backend", "vllm-modular")
    request, plans = prepare(build_parser().parse_args(args), args)
    backend = VllmModularBackend(
        resolve=fv.resolver(fv.modular_namespace()), activities=fv.activities
    )
    refs: list[weakref.ref[Any]] = []
    alive_at_build: list[int] = []
    build = backend.build

    def tracked_build(*args: Any) -> Any:
        alive_at_build.append(sum(r() is not None for r in refs))
        session = build(*args)
        allocate = session.allocate_banks

        def tracked_allocate(count: int) -> None:
            allocate(count)
            refs.extend(weakref.ref(t) for bank in session.banks for t in bank)

        session.allocate_banks = tracked_allocate
        refs.append(weakref.ref(session))
        return session

    monkeypatch.setattr(backend, "build", tracked_build)
    progress = ProgressReporter(None, bar=False, total=sum(len(p.points) for p in plans))
    gc.disable()
    try:
        for plan in plans:
            # Admission needs CUDA; the build and the protocol run on CPU with the fakes.
            report = AdmissionReport(plan.target, "vllm-modular", (Admission.accept(backend.name),))
            # One point per component: enough to build, allocate banks and measure (CI time).
            few = [next(p for p in plan.points if p.component == c) for c in plan.components]
            small = dataclasses.replace(plan, points=tuple(few))
            outcome = acquire_target(request, small, backend, fv.fake_runtime(), report, progress)
            assert outcome.published and outcome.measured_now == len(few)
    finally:
        gc.enable()
        progress.close()
    assert alive_at_build == [0, 0] and len(refs) > 2
    assert all(r() is None for r in refs)


def test_a_cancelled_isolated_run_stops_its_child_and_resumes(
    tiny_model: Path, tmp_path: Path
) -> None:
    """R9: SIGTERM to the parent stops the measuring child (no orphan), exits 130 with a
    `cancelled` event, keeps the samples; the same command resumes them and publishes."""
    import signal
    import time

    out, progress = tmp_path / "out", tmp_path / "progress.jsonl"
    # More forwards per context than the other runs, so that the signal lands mid-target.
    slow = ["--measurement-iterations", "12", "--isolate-targets", "on"]
    args = argv(tiny_model, out, *slow, "--progress-json", str(progress))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    stderr = (tmp_path / "stderr.txt").open("wb")
    parent = subprocess.Popen(
        [sys.executable, "-m", "acquisition", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and parent.poll() is None:
        seen = events(progress) if progress.exists() else []
        if any(e["phase"] == "measure" and e["points_done"] > 0 for e in seen):
            break
        time.sleep(0.05)
    assert parent.poll() is None, "the run ended before it could be cancelled"
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == 130
    stderr.close()
    cancelled = events(progress)[-1]
    assert cancelled["phase"] == "cancelled"
    # The child's last words reach the parent: no broken pipe in the child (it printed a
    # traceback and exited 1).
    assert b"Traceback" not in (tmp_path / "stderr.txt").read_bytes()
    children = [
        p
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and str(out).encode() in _cmdline(p) and b"--only-target" in _cmdline(p)
    ]
    assert children == []
    kept = len(sample_records(out, DEPLOYMENTS[0], "forward"))
    assert kept > 0
    again = tmp_path / "again.jsonl"
    rerun = argv(
        tiny_model, out, *slow[:2], "--isolate-targets", "off", "--progress-json", str(again)
    )
    assert main(rerun) == 0
    resumed = [e for e in events(again) if str(e.get("message", "")).startswith("resumed:")]
    # The stop waits for a batch's checkpoint and its points' progress events together
    # (acquisition.deferred_stop): the cancelled count is the one the resume finds.
    assert resumed and 0 < cancelled["points_done"] == resumed[0]["points_done"]
    assert sorted(tables(out)) == DEPLOYMENTS
    assert len(sample_records(out, DEPLOYMENTS[0], "forward")) >= kept


def _cmdline(process: Path) -> bytes:
    try:
        return (process / "cmdline").read_bytes()
    except OSError:
        return b""
