"""scripts/h200_next.sh on CPU: the next burst's parts, their plans (kernel-step rule v2, named,
for the f2k Qwen3 tables, v3/v4 for their parts, off where a shipped plan is resumed or
completed), limits, packing and resume.

``python3`` and ``nvidia-smi`` are the stand-ins of ``script_stubs``.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest
from script_stubs import make_stubs, members, run_script

from acquisition.cli import build_parser, prepare
from acquisition.plan.kernel import KERNEL_STEPS_RULE

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200_next.sh"


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    return make_stubs(tmp_path)


def run(stubs: Path, tmp_path: Path, *parts: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_script(SCRIPT, stubs, tmp_path, *parts, **env)


def planned(argv_line: str) -> list[tuple[str | None, int]]:
    """The kernel-step rule and point count of each target the recorded command plans (the
    stub records ``-m acquisition slice ...`` and then ``PWD=...``)."""
    words = argv_line.split()
    args = words[2 : next(i for i, w in enumerate(words) if w.startswith("PWD="))]
    _, plans = prepare(build_parser().parse_args(args), args)
    return [(p.kernel.rule if p.kernel else None, len(p.points)) for p in plans]


def summary(tmp_path: Path) -> list[str]:
    return (tmp_path / "out" / "summary.txt").read_text().splitlines()


def test_qwen3_modular_runs_dp1_then_both_dp2_ranks_with_the_rule(
    stubs: Path, tmp_path: Path
) -> None:
    result = run(stubs, tmp_path, "qwen3-modular")
    assert result.returncode == 0, result.stderr
    line = summary(tmp_path)[0]
    assert line.startswith("qwen3-modular: exit 0")
    for deployment in ("dp1_ep1_rank0_sp0", "dp2_ep2_rank0_sp0", "dp2_ep2_rank1_sp0"):
        assert deployment in line
    argv = (tmp_path / "root" / "qwen3-modular" / "argv.txt").read_text()
    assert "Qwen/Qwen3-30B-A3B-Instruct-2507 " in argv
    # The f2k tables' plan, named: `on` now plans v4 (docs/acquisition.md, "Rule v4").
    assert "--moe-kernel-steps v2" in argv and "--moe-grid-factor 2" in argv
    assert "--dp 1,2 --backend vllm-modular" in argv
    # R13: the command plans what bundles/H200-vllm-modular-f2k measured (568 + 1,207 + 1,207).
    v2 = KERNEL_STEPS_RULE
    assert planned(argv) == [(v2, 568), (v2, 1207), (v2, 1207)]
    packed = members(tmp_path / "out" / "qwen3-modular.tar.gz")
    assert any(n.startswith("qwen3-modular/out/H200/") for n in packed)
    assert not any(n.endswith("writer.lock") for n in packed)


def test_a_part_past_its_limit_is_stopped_and_the_next_still_runs(
    stubs: Path, tmp_path: Path
) -> None:
    result = run(
        stubs, tmp_path, "qwen3-live", "fp8-dp1", "bogus", STUB_SLOW="2507/vllm-live",
        QWEN3_LIVE_S="1",
    )  # fmt: skip
    assert "unknown part bogus" in result.stdout
    lines = summary(tmp_path)
    assert lines[0].startswith("qwen3-live: exit 124")
    assert "qwen3-live/run.log" in members(tmp_path / "out" / "qwen3-live.tar.gz")
    assert lines[1].startswith("fp8-dp1: exit 0")
    assert lines[1].endswith("dp1_ep1_rank0_sp0 ")
    # The FP8 DP1 re-measure: the shipped plan (rule off), DP1 alone, DeepGEMM off for it only.
    argv = (tmp_path / "root" / "fp8-dp1" / "modular" / "argv.txt").read_text()
    assert "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8 " in argv
    assert "--moe-kernel-steps off" in argv and "--dp 1 --backend vllm-modular" in argv
    assert argv.strip().endswith("VLLM_USE_DEEP_GEMM=0")
    live = (tmp_path / "root" / "qwen3-live" / "argv.txt").read_text()
    assert live.strip().endswith("VLLM_USE_DEEP_GEMM=unset")


def state_tarball(path: Path, top: str) -> Path:
    """A checkpoint archive: call 12's layout (top mixtral-modular/) or a bundle's (top out/)."""
    with tarfile.open(path, "w:gz") as tar:
        for name in (f"{top}out/_acquisition/x/samples.jsonl", f"{top}run.log"):
            data = b"{}\n"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("top", ["./mixtral-modular/", "mixtral-modular/", ""])
def test_mixtral_rank1_resumes_the_carried_checkpoint_with_the_shipped_plan(
    stubs: Path, tmp_path: Path, top: str
) -> None:
    carried = state_tarball(tmp_path / "state.tar.gz", top)
    result = run(stubs, tmp_path, "mixtral-rank1", MIXTRAL_FROM=str(carried))
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "root" / "mixtral-rank1" / "mixtral-modular"
    assert (run_dir / "out" / "_acquisition" / "x" / "samples.jsonl").is_file()
    argv = (run_dir / "argv.txt").read_text()
    assert "mistralai/Mixtral-8x7B-Instruct-v0.1 " in argv and "--moe-kernel-steps off" in argv
    assert summary(tmp_path)[0].startswith("mixtral-rank1: exit 0")
    packed = members(tmp_path / "out" / "mixtral-rank1.tar.gz")
    assert "mixtral-rank1/mixtral-modular/out/_acquisition/x/samples.jsonl" in packed
    assert not any(n.endswith("runs.tar.gz") for n in packed)


def test_a_later_call_resumes_a_packed_part(stubs: Path, tmp_path: Path) -> None:
    run(stubs, tmp_path, "qwen3-live", STUB_SLOW="2507/vllm-live", QWEN3_LIVE_S="1")
    first = tmp_path / "first.tar.gz"
    (tmp_path / "out" / "qwen3-live.tar.gz").rename(first)
    later = tmp_path / "later"
    result = run(stubs, later, "qwen3-live", RESUME_FROM=str(first))
    assert result.returncode == 0, result.stderr
    assert f"resumed state from {first}" in result.stdout
    log = (later / "root" / "qwen3-live" / "run.log").read_text()
    assert log.count("published") == 1  # the stopped call's log travelled on
    assert (later / "root" / "qwen3-live" / "argv.txt").read_text().count("slice") == 2


def test_nothing_to_run_is_an_error(stubs: Path, tmp_path: Path) -> None:
    assert run(stubs, tmp_path).returncode == 2


def test_extra_arguments_reach_the_qwen3_acquisitions(stubs: Path, tmp_path: Path) -> None:
    result = run(stubs, tmp_path, "qwen3-live", EXTRA_ARGS="--triton-precompile-workers 1")
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "root" / "qwen3-live" / "argv.txt").read_text()
    assert "--engine-attention-backend TRITON_ATTN --triton-precompile-workers 1" in argv
    # bundles/H200-vllm-live-f2k's plan, named (`on` plans v4 now).
    assert planned(argv) == [(KERNEL_STEPS_RULE, 568)]


@pytest.mark.parametrize(
    ("part", "backend", "rule", "not_rule"),
    [
        ("v3-modular-dp1", "vllm-modular", "v3", "v2"),
        ("v3-live", "vllm-live", "v3", "v2"),
        ("v4-modular-dp1", "vllm-modular", "v4", "v3"),
        ("v4-live", "vllm-live", "v4", "v3"),
    ],
)
def test_the_rule_parts_run_dp1_with_their_rule(
    stubs: Path, tmp_path: Path, part: str, backend: str, rule: str, not_rule: str
) -> None:
    """Issue 20 item 1: the re-measures of DP1 and live with kernel-step rules v3 and v4."""
    result = run(stubs, tmp_path, part)
    assert result.returncode == 0, result.stderr
    assert summary(tmp_path)[0].startswith(f"{part}: exit 0")
    argv = (tmp_path / "root" / part / "argv.txt").read_text()
    assert f"--moe-kernel-steps {rule}" in argv and f"--moe-kernel-steps {not_rule}" not in argv
    assert f"--dp 1 --backend {backend}" in argv
