"""scripts/h200_conserve.sh on CPU (issue 14): which bundles it picks, one conserve process for
all of them, validation of what came out and the tarball the lead unpacks at the repository root.

``PYTHON`` is a stand-in that runs ``python -m acquisition conserve`` with the fakes of
``conserve_fakes`` (fake vLLM path, fake GPU, fake profiler) and everything else, such as
``python -m moetables validate``, with the real interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conserve_fakes import acquire
from tiny_moe import write_model

from moetables.bundle import validate_bundle

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "h200_conserve.sh"
HERE = Path(__file__).resolve().parent

PYTHON_STUB = f"""#!/usr/bin/env bash
if [ "$1 $2 $3" = "-m acquisition conserve" ]; then
  shift 3
  exec {sys.executable} {HERE / "conserve_fakes.py"} "$@"
fi
exec {sys.executable} "$@"
"""


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two small bundles: one published without conservation, one with it."""
    root = tmp_path_factory.mktemp("script")
    model = write_model(root / "tiny", num_experts=8)
    return (
        acquire(model, root / "untraced", traced=False),
        acquire(model, root / "traced", traced=True),
    )


@pytest.fixture
def repo(tmp_path: Path, published: tuple[Path, Path]) -> Path:
    """A repository root whose bundles/ holds: an H200 bundle lacking traces (picked), an H200
    bundle with them (skipped) and a non-H200 bundle lacking them (skipped)."""
    untraced, traced = published
    root = tmp_path / "repo"
    shutil.copytree(untraced, root / "bundles/H200-old/test/tiny/bf16")
    shutil.copytree(traced, root / "bundles/H200-new/test/tiny/bf16")
    shutil.copytree(untraced, root / "bundles/rtx/test/tiny/bf16")
    return root


def run(tmp_path: Path, repo: Path, *bundles: str, **env: str) -> subprocess.CompletedProcess[str]:
    stub = tmp_path / "python-stub"
    stub.write_text(PYTHON_STUB)
    stub.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'FAKE GPU, GPU-0, 0'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": f"{REPO}:{HERE}",
        "PYTHON": str(stub),
        "REPO_DIR": str(repo),
        "OUT": str(tmp_path / "out"),
        "STAGE": str(tmp_path / "stage"),
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *bundles],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_it_traces_only_the_h200_tables_without_conservation(tmp_path: Path, repo: Path) -> None:
    before = {p: p.read_bytes() for p in (repo / "bundles").rglob("*") if p.is_file()}
    result = run(tmp_path, repo)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "out"
    log = (out / "conserve.log").read_text()
    assert "1 bundles, 3 tables without conservation: bundles/H200-old/test/tiny/bf16" in log
    assert "H200-new" not in log.split("timeout")[1].splitlines()[0]  # not in the command
    assert "bundles/rtx" not in log
    assert "FAKE GPU" in log  # the GPU line, for the record
    # scripts/h200_conservation.py's summary of each written table, marked as traced later
    assert log.count("traced separately from the table at") == 3
    assert "tokens     4 (expert rows 8, composed (collectives excluded))" in log
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("conserve: exit 0") and "1 of 1 bundles written, 1 valid" in summary
    # the repository's own bundles are untouched: the updated copy comes back packed
    assert {p: p.read_bytes() for p in (repo / "bundles").rglob("*") if p.is_file()} == before
    unpacked = tmp_path / "unpacked"
    with tarfile.open(out / "conserve-bundles.tar.gz") as tar:
        names = tar.getnames()
        tar.extractall(unpacked, filter="data")
    assert all(n.startswith("bundles/H200-old/test/tiny/bf16") for n in names)
    assert not any(n.endswith(".meta.lock") for n in names)
    bundle = unpacked / "bundles/H200-old/test/tiny/bf16"
    report = validate_bundle(bundle)
    assert report.ok, report.problems
    assert all(e.conservation_supplement is not None for e in report.quality.values())
    assert len(list(bundle.rglob("conservation.csv"))) == 3
    assert (out / "progress.jsonl").read_text().count('"phase": "publish"') == 1


def test_a_second_call_keeps_what_the_first_wrote(tmp_path: Path, repo: Path) -> None:
    """A call stopped by its limit is completed by the same command on the warm machine: the
    bundles already staged are packed again, not traced again (conserve refuses to overwrite)."""
    assert run(tmp_path, repo).returncode == 0
    first = (tmp_path / "stage" / "bundles/H200-old/test/tiny/bf16" / "meta.yaml").read_bytes()
    result = run(tmp_path, repo)
    assert result.returncode == 0, result.stdout + result.stderr
    log = (tmp_path / "out" / "conserve.log").read_text()
    assert "written by an earlier call on this machine, kept" in log
    second = (tmp_path / "stage" / "bundles/H200-old/test/tiny/bf16" / "meta.yaml").read_bytes()
    assert first == second
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "1 of 1 bundles written, 1 valid" in summary
    with tarfile.open(tmp_path / "out" / "conserve-bundles.tar.gz") as tar:
        assert any(n.endswith("meta.yaml") for n in tar.getnames())


def test_another_gpu_is_refused_and_nothing_is_packed(tmp_path: Path, repo: Path) -> None:
    result = run(tmp_path, repo, STUB_GPU="NVIDIA A100-SXM4-80GB")
    assert result.returncode == 1
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("conserve: exit 1") and "0 of 1 bundles written" in summary
    assert "NVIDIA A100" in (out / "conserve.log").read_text()
    assert not (out / "conserve-bundles.tar.gz").exists()


def test_named_bundles_are_taken_as_given(tmp_path: Path, repo: Path) -> None:
    """A bundle with traces named explicitly is refused by the command (exit 2), not skipped."""
    result = run(tmp_path, repo, "bundles/H200-new/test/tiny/bf16")
    assert result.returncode == 2
    assert "measured with its table" in (tmp_path / "out" / "conserve.log").read_text()


def test_nothing_to_do_is_said(tmp_path: Path, repo: Path) -> None:
    shutil.rmtree(repo / "bundles/H200-old")
    result = run(tmp_path, repo)
    assert result.returncode == 0
    assert (tmp_path / "out" / "summary.txt").read_text() == "conserve: nothing to do\n"
