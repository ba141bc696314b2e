"""python -m acquisition on CPU, end to end: bundle, resume after kill -9, failures (R9, R35-R37).

Small geometry (4 experts, top-2, hidden 16) so that the whole file runs in seconds. The
quality tolerance is widened because a shared CI CPU is noisy; the contract records it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from tiny_moe import write_model

from acquisition.cli import main
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
    "--max-num-seqs",
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


def cli(model: Path, out: Path, *extra: str, budget: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "acquisition",
        "slice",
        str(model),
        *COMMON,
        "--max-num-batched-tokens",
        str(budget),
        "--out-root",
        str(out),
        *extra,
    ]


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def run_here(args: list[str]) -> int:
    """The same command in this process: no second torch import or profiler start-up."""
    assert args[1:3] == ["-m", "acquisition"]
    return main(args[3:])


def records(path: Path, kind: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if record.get("type") == kind:
            out.append(record)
    return out


def table(path: Path) -> dict[tuple[str, int, int, int], float]:
    rows = {}
    for line in path.read_text().splitlines()[1:]:
        c, _, n, a, m, t = line.split(",")
        rows[(c, int(n), int(a), int(m))] = float(t)
    return rows


@pytest.fixture(scope="module")
def acquired(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("e2e")
    model = write_model(root / "tiny-moe")
    out = root / "out"
    progress = root / "progress.jsonl"
    result = run(cli(model, out, "--dp", "1,2", "--progress-json", str(progress)))
    return {"result": result, "out": out, "progress": progress, "model": model}


def test_it_publishes_a_bundle_that_moetables_validates(acquired: dict[str, Any]) -> None:
    result = acquired["result"]
    assert result.returncode == 0, result.stderr
    bundle = acquired["out"] / "CPU" / "test" / "tiny-moe" / "fp32"
    report = validate_bundle(bundle)
    assert report.ok, report.problems
    assert report.bundle is not None
    entries = {e.target.deployment: e for e in report.bundle.entries}
    assert sorted(entries) == ["dp1_ep1_rank0_sp0", "dp2_ep2_rank0_sp0", "dp2_ep2_rank1_sp0"]
    assert entries["dp1_ep1_rank0_sp0"].components == ("gate_routing", "experts")
    assert entries["dp2_ep2_rank1_sp0"].components == ("gate_routing", "experts", "finalize_copy")
    # Runtime files only: the checkpoint and any failure evidence live outside the bundle.
    names = {p.name for p in bundle.rglob("*") if p.is_file()}
    # Plus the quality evidence beside each table (format 2); the CPU path traces no native
    # forward, so conservation is declared absent with its reason rather than written.
    assert names == {"meta.yaml", "components.csv", "stability.csv"}
    work = acquired["out"] / "_acquisition" / "CPU" / "test" / "tiny-moe" / "fp32" / "tp1"
    assert (work / "moe_components" / "dp2_ep2_rank1_sp0" / "samples.jsonl").is_file()


def test_it_publishes_every_control_of_every_published_point(acquired: dict[str, Any]) -> None:
    """R18, R34: stability.csv holds each expert point's B/2B medians and its attempts; the
    published attempt's 2B median is the table's time, and the contract names its method."""
    bundle = acquired["out"] / "CPU" / "test" / "tiny-moe" / "fp32"
    report = validate_bundle(bundle)
    assert report.ok, report.problems
    work = acquired["out"] / "_acquisition" / "CPU" / "test" / "tiny-moe" / "fp32" / "tp1"
    for entry in report.bundle.entries if report.bundle else ():
        assert entry.format_version == 2
        assert entry.contract["schema"] == "moe-components-contract-v1"
        # CPU timings are noisy, so this run allows 90 %: looser than the method's 3 %, the
        # contract must call it exploratory (and name lookups skip it).
        assert entry.contract["quality"] == "exploratory" and entry.exploratory
        evidence = report.quality[entry.table_path]
        assert evidence.stability is not None and evidence.conservation is None
        assert "traces no native MoE forward" in (evidence.conservation_absent or "")
        controls = records(
            work / "moe_components" / entry.target.deployment / "samples.jsonl", "control"
        )
        assert len(evidence.stability) == len(controls)
        rows = table(bundle / entry.table_path)
        published = {r.point: r for r in evidence.stability if r.published}
        experts = {k[1:]: t for k, t in rows.items() if k[0] == "experts"}
        assert set(published) == set(experts)
        for point, row in published.items():
            assert row.b2_median_us == experts[point]
            assert row.b2_sets == 2 * row.b_sets


def test_its_contract_is_truthful_and_complete(acquired: dict[str, Any]) -> None:
    meta = yaml.safe_load((acquired["out"] / "CPU/test/tiny-moe/fp32/meta.yaml").read_text())
    entry = meta["per_tp"][1]["moe_components"]["entries"][1]
    contract, coverage = entry["contract"], entry["coverage"]
    assert contract["target"] == {"tp": 1, "dp": 2, "ep": 2, "rank": 0, "sequence_parallel": False}
    assert (contract["global_experts"], contract["global_top_k"], contract["local_experts"]) == (
        4,
        2,
        2,
    )
    assert contract["expert_map"] == [0, 1, -1, -1] and contract["placement"] == "linear"
    assert (contract["local_token_budget"], contract["maximum_expert_tokens"]) == (2, 4)
    assert contract["modes"] == ["eager"]
    assert contract["backend"]["name"] == "torch-reference"
    assert contract["backend"]["native"] is False
    assert contract["measurement"]["attribution"] == "cpu_operator_events_v1"
    assert contract["expert_conditioning"]["quality_relative_tolerance"] == 0.9
    assert contract["expert_conditioning"]["banks"] == 4  # clones for 2B = 2 x 2 sets
    assert contract["expert_conditioning"]["control_sets"] == {"min": 2, "max": 2}
    assert contract["expert_sampling"]["point_plan_sha256"]
    provenance = contract["provenance"]
    assert provenance["device"] == "cpu" and provenance["torch_version"] == torch.__version__
    assert "slice" in provenance["command_line"] and len(provenance["acquisition_contexts"]) == 1
    assert coverage["complete"] is True
    assert coverage["completed_rounds"] == coverage["points"] * 2
    summary = coverage["conditioning_summary"]
    assert summary["failed_points"] == 0 and summary["checked_points"] > 0
    assert 0 <= summary["max_relative_change"] <= 0.9
    assert "conditioning_controls" not in coverage  # R34: controls stay in samples.jsonl


def test_its_tables_answer_lookups(acquired: dict[str, Any]) -> None:
    from moetables.errors import CoverageError
    from moetables.lookup import ComponentTables

    bundle = acquired["out"] / "CPU/test/tiny-moe/fp32"
    report = validate_bundle(bundle)
    assert report.bundle is not None
    entry = next(e for e in report.bundle.entries if e.target.deployment == "dp2_ep2_rank0_sp0")
    rows = report.tables[entry.table_path]
    deployment = ComponentTables(bundle).deployment(1, 2, 0)
    experts = rows.select("experts", "eager")
    for n, a, m, t in zip(
        rows.tokens[experts].tolist(),
        rows.activated_experts[experts].tolist(),
        rows.local_assignments[experts].tolist(),
        rows.time_us[experts].tolist(),
        strict=True,
    ):
        assert deployment.time_us("experts", n, a, m) == t  # exact rows as stored
    gate = rows.select("gate_routing", "eager")
    assert deployment.time_us("gate_routing", 2) == float(
        rows.time_us[gate][rows.tokens[gate] == 2][0]
    )
    with pytest.raises(CoverageError):
        deployment.time_us("gate_routing", 3)  # outside measured support: never extrapolated


def test_it_reports_progress_as_json_lines(acquired: dict[str, Any]) -> None:
    events = [json.loads(line) for line in acquired["progress"].read_text().splitlines()]
    phases = [e["phase"] for e in events]
    for phase in ("plan", "admission", "build", "measure", "publish", "done"):
        assert phase in phases
    done = events[-1]
    assert done["phase"] == "done" and done["points_done"] == done["points_total"] > 0
    assert done["bundle"].endswith("CPU/test/tiny-moe/fp32")
    assert all(
        {"phase", "points_done", "points_total", "eta_s", "message"} <= set(e) for e in events
    )
    assert any(e["eta_s"] is not None for e in events if e["phase"] == "measure")


def test_a_killed_run_resumes_to_the_same_plan_and_a_complete_table(tmp_path: Path) -> None:
    model = write_model(tmp_path / "tiny-moe")
    out = tmp_path / "out"
    args = cli(model, out, "--dp", "2", "--ep", "2", budget=4)
    work = out / "_acquisition/CPU/test/tiny-moe/fp32/tp1/moe_components/dp2_ep2_rank0_sp0"
    samples = work / "samples.jsonl"
    log = (tmp_path / "killed.log").open("w")
    process = subprocess.Popen(
        args,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 90
        while len(records(samples, "point")) < 6:
            assert process.poll() is None, "finished before it could be killed"
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.05)
    finally:
        # SIGKILL in every case: the point of the test, and no child outlives a failure.
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        log.close()
    before = {
        r["point"]: r["time_us"] for r in records(samples, "point") if r["status"] == "measured"
    }
    plan_before = (work / "plan.json").read_text()
    assert not (out / "CPU").exists() or not list((out / "CPU").rglob("dp2_ep2_rank0_sp0"))

    assert run_here(args) == 0
    assert (work / "plan.json").read_text() == plan_before
    plan = json.loads(plan_before)
    bundle = out / "CPU/test/tiny-moe/fp32"
    assert validate_bundle(bundle).ok
    rows = table(bundle / "tp1/moe_components/dp2_ep2_rank0_sp0/components.csv")
    assert sorted(rows) == sorted((c, n, a, m) for c, n, a, m in plan["points"])
    # Points measured before the kill were kept, not measured again.
    for key, time_us in before.items():
        component, *coords = key.split(":")
        n, a, m = (
            (int(coords[0]), int(coords[1]), int(coords[2]))
            if coords[1:]
            else (int(coords[0]), -1, -1)
        )
        assert rows[(component, n, a, m)] == time_us
    sessions = records(samples, "session")
    assert len(sessions) == 2 and sessions[0]["identity"] == sessions[1]["identity"]

    # A rerun of a complete acquisition changes nothing, not even its provenance.
    meta_before = (bundle / "meta.yaml").read_bytes()
    assert run_here(args) == 0
    assert (bundle / "meta.yaml").read_bytes() == meta_before


def test_a_point_failing_its_control_is_not_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_model(tmp_path / "tiny-moe")
    out = tmp_path / "out"
    progress = tmp_path / "progress.jsonl"
    args = cli(model, out, "--progress-json", str(progress))
    args[args.index("--quality-tolerance") + 1] = "1e-12"
    assert run_here([*args, "--control-attempts", "1"]) == 1
    assert "failed the stability control" in capsys.readouterr().err
    assert not (out / "CPU").exists()  # nothing published
    work = out / "_acquisition/CPU/test/tiny-moe/fp32/tp1/moe_components/dp1_ep1_rank0_sp0"
    assert records(work / "samples.jsonl", "control")  # the evidence is kept
    assert json.loads(progress.read_text().splitlines()[-1])["phase"] == "failed"


def test_the_cuda_path_publishes_a_valid_bundle(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (runs on the H200 machine)")
    model = write_model(
        tmp_path / "tiny-moe",
        torch_dtype="bfloat16",
        hidden_size=256,
        moe_intermediate_size=128,
        num_experts=8,
    )
    out = tmp_path / "out"
    args = cli(model, out, "--dp", "1,2", budget=8)
    for flag, value in (
        ("--device", "cuda"),
        ("--cache-bytes", None),
        ("--quality-tolerance", "0.5"),
    ):
        i = args.index(flag)
        if value is None:
            del args[i : i + 2]
        else:
            args[i + 1] = value
    assert run_here(args) == 0
    bundle = out / "CPU/test/tiny-moe/bf16"
    report = validate_bundle(bundle)
    assert report.ok, report.problems
    assert report.bundle is not None
    contract = report.bundle.entries[0].contract
    assert contract["measurement"]["attribution"] == "launch_correlation_v1"
    assert contract["backend"]["device"] == "cuda"
    assert contract["provenance"]["cache_source"].endswith("L2_cache_size")


def test_a_refusal_found_while_building_exits_3_before_any_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import acquisition.adapters as adapters
    from acquisition.adapters.base import AdapterRefusal
    from acquisition.adapters.torch_reference import TorchReferenceBackend

    class Refusing(TorchReferenceBackend):
        def build(self, *args: object, **kwargs: object) -> Any:
            raise AdapterRefusal(self.name, "native prepare launches work")

    monkeypatch.setattr(adapters, "BACKENDS", (Refusing(),))
    model = write_model(tmp_path / "tiny-moe")
    out = tmp_path / "out"
    assert run_here(cli(model, out)) == 3
    assert "native prepare launches work" in capsys.readouterr().err
    assert not list(out.rglob("samples.jsonl"))


def test_a_changed_command_is_refused_before_the_target_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """R9/R36: resuming a checkpoint under other semantic conditions is refused, naming the
    option, before the backend builds anything (on the H200 a build is an engine start of
    20-60 s; the refusal used to come after it)."""
    import acquisition.adapters as adapters
    from acquisition.adapters.torch_reference import TorchReferenceBackend

    builds: list[str] = []

    class Counting(TorchReferenceBackend):
        def build(self, *args: Any, **kwargs: Any) -> Any:
            builds.append(self.name)
            return super().build(*args, **kwargs)

    monkeypatch.setattr(adapters, "BACKENDS", (Counting(),))
    model = write_model(tmp_path / "tiny-moe")
    out = tmp_path / "out"
    work = out / "_acquisition/CPU/test/tiny-moe/fp32/tp1/moe_components/dp1_ep1_rank0_sp0"
    assert run_here(cli(model, out)) == 0
    assert builds == ["torch-reference"]
    (work / "published.json").unlink()  # a checkpoint to resume, not a finished target
    changed = [*cli(model, out)]
    changed[changed.index("--moe-rounds") + 1] = "3"
    capsys.readouterr()
    assert run_here(changed) != 0
    assert builds == ["torch-reference"], "the backend was built before the refusal"
    err = capsys.readouterr().err
    assert "other semantic conditions" in err and "protocol.rounds (2 -> 3)" in err
