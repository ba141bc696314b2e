"""scripts/h200_repeat.sh on CPU: the before tree, issue 19's before/after pair and issue 20
item 6's repeatability runs, their plans, caches, checks, budget and packing.

``python3`` and ``nvidia-smi`` are the stand-ins of ``script_stubs`` (``python3 bench/...``
is recorded in ``STUB_BENCH_LOG``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from script_stubs import make_stubs, members, run_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200_repeat.sh"
REPO = SCRIPT.parents[1]


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    return make_stubs(tmp_path)


def run(stubs: Path, tmp_path: Path, *parts: str, **env: str) -> subprocess.CompletedProcess[str]:
    env.setdefault("ACQ_BEFORE", str(tmp_path / "before"))
    env.setdefault("STUB_BENCH_LOG", str(tmp_path / "bench.log"))
    return run_script(SCRIPT, stubs, tmp_path, *parts, **env)


def summary(tmp_path: Path) -> list[str]:
    return (tmp_path / "out" / "summary.txt").read_text().splitlines()


def fake_before(tmp_path: Path) -> Path:
    before = tmp_path / "before"
    (before / "acquisition").mkdir(parents=True)
    return before


def test_prepare_writes_the_before_code_as_a_small_carried_tree(
    stubs: Path, tmp_path: Path
) -> None:
    result = run(stubs, tmp_path, "prepare", BEFORE="HEAD")
    assert result.returncode == 0, result.stderr
    before = tmp_path / "before"
    assert (before / "acquisition" / "cli.py").is_file()
    assert (before / "moetables").is_dir() and not (before / "bench").exists()
    assert not (before / "bundles").exists()  # code only: it travels with the call
    size = sum(f.stat().st_size for f in before.rglob("*") if f.is_file())
    assert size < 4 << 20
    assert "carry it" in (tmp_path / "out" / "repeat.log").read_text()


def test_the_modular_pair_runs_after_then_before_on_equal_plans_from_cold_caches(
    stubs: Path, tmp_path: Path
) -> None:
    before = fake_before(tmp_path)
    result = run(stubs, tmp_path, "ab-modular")
    assert result.returncode == 0, result.stderr
    lines = summary(tmp_path)
    assert lines[0].startswith("ab-modular/after-modular-f2: exit 0")
    assert lines[1].startswith("ab-modular/before-modular-f2: exit 0")
    root = tmp_path / "root" / "ab-modular"
    after_argv = (root / "after-modular-f2" / "argv.txt").read_text()
    before_argv = (root / "before-modular-f2" / "argv.txt").read_text()
    for argv in (after_argv, before_argv):
        assert "Qwen/Qwen3-30B-A3B-Instruct-2507 " in argv and "--moe-grid-factor 2" in argv
        assert "--dp 2 " in argv and "--ranks 0" in argv and "--isolate-targets off" in argv
        assert "--backend vllm-modular" in argv
    # the after run asks for the shipped plan; the before code has no kernel-step option
    assert "--moe-kernel-steps off" in after_argv and "--moe-kernel-steps" not in before_argv
    assert f"PWD={REPO} " in after_argv and f"PWD={before} " in before_argv
    # each run from its own empty Triton cache (compile time is part of a run)
    assert f"TRITON_CACHE_DIR={root / 'after-modular-f2' / 'triton'} " in after_argv
    assert f"TRITON_CACHE_DIR={root / 'before-modular-f2' / 'triton'} " in before_argv
    bench = (tmp_path / "bench.log").read_text()
    assert f"bench/acquisition_speed_summary.py {root} (in {REPO})" in bench
    packed = members(tmp_path / "out" / "ab-modular.tar.gz")
    assert any(n.startswith("ab-modular/after-modular-f2/out/H200/") for n in packed)
    assert any(n.startswith("ab-modular/before-modular-f2/out/H200/") for n in packed)
    assert not any(n.endswith("writer.lock") for n in packed)


def test_every_rank_when_asked_and_the_live_pair_has_no_ranks(stubs: Path, tmp_path: Path) -> None:
    fake_before(tmp_path)
    result = run(stubs, tmp_path, "ab-modular", "ab-live", AB_RANKS="", AB_DPS="1,2")
    assert result.returncode == 0, result.stderr
    root = tmp_path / "root"
    modular = (root / "ab-modular" / "after-modular-f2" / "argv.txt").read_text()
    assert "--dp 1,2 " in modular and "--ranks" not in modular
    live = (root / "ab-live" / "before-live-f2" / "argv.txt").read_text()
    assert "--backend vllm-live" in live and "--ranks" not in live
    assert "--engine-attention-backend TRITON_ATTN" in live


def test_without_the_before_tree_the_after_run_still_runs(stubs: Path, tmp_path: Path) -> None:
    result = run(stubs, tmp_path, "ab-modular")
    assert result.returncode == 0, result.stderr
    lines = summary(tmp_path)
    assert lines[0].startswith("ab-modular/after-modular-f2: exit 0")
    assert lines[1].startswith("ab-modular/before-modular-f2: skipped (no ")
    assert "holds no project copy" in (tmp_path / "out" / "repeat.log").read_text()


def test_repeat_measures_both_dp1_tables_again_and_checks_them_against_the_shipped_ones(
    stubs: Path, tmp_path: Path
) -> None:
    result = run(stubs, tmp_path, "repeat", STUB_BENCH_EXIT="1")
    assert result.returncode == 0, result.stderr
    root = tmp_path / "root" / "repeat"
    for label, model in (
        ("qwen15-dp1", "Qwen/Qwen1.5-MoE-A2.7B"),
        ("mixtral-dp1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    ):
        argv = (root / label / "argv.txt").read_text()
        assert f"slice {model} " in argv and "--dp 1 " in argv
        assert "--moe-kernel-steps off" in argv and "--moe-grid-factor 2" in argv
        # one cache for both models of the part
        assert f"TRITON_CACHE_DIR={root / 'triton'} " in argv
    bench = (tmp_path / "bench.log").read_text().splitlines()
    assert bench == [
        f"bench/acquisition_equivalence.py bundles/H200-vllm-modular-f2 {root / label}/out "
        f"--model {model} --check (in {REPO})"
        for label, model in (
            ("qwen15-dp1", "Qwen/Qwen1.5-MoE-A2.7B"),
            ("mixtral-dp1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
        )
    ]
    # a disagreeing check is reported, not hidden
    assert "repeat/qwen15-dp1: check exit 1" in summary(tmp_path)
    check = (tmp_path / "out" / "repeat-check.md").read_text()
    assert check.count("check exit 1") == 2 and "verdict: stub" in check
    packed = members(tmp_path / "out" / "repeat.tar.gz")
    assert any(n.startswith("repeat/qwen15-dp1/out/H200/Qwen/Qwen1.5-MoE-A2.7B/") for n in packed)
    assert any(n.startswith("repeat/mixtral-dp1/out/H200/mistralai/") for n in packed)


def test_a_run_past_its_limit_is_stopped_and_runs_past_the_budget_are_skipped(
    stubs: Path, tmp_path: Path
) -> None:
    fake_before(tmp_path)
    result = run(
        stubs, tmp_path, "ab-modular", "repeat", STUB_SLOW="2507/vllm-modular",
        AB_MODULAR_S="2", BUDGET_S="60", RESERVE_S="10", MIN_RUN_S="49",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = summary(tmp_path)
    assert lines[0].startswith("ab-modular/after-modular-f2: exit 124")
    # 60 s budget - 10 reserved = 50 at the start; after the 2 s run less than 49 is left
    assert "ab-modular/before-modular-f2: skipped (budget)" in lines
    assert "repeat/qwen15-dp1: skipped (budget)" in lines
    assert "repeat/mixtral-dp1: skipped (budget)" in lines


def test_host_cost_times_the_forward_steps_on_the_device(stubs: Path, tmp_path: Path) -> None:
    result = run(stubs, tmp_path, "host-cost", HOST_COST_DP="2")
    assert result.returncode == 0, result.stderr
    bench = (tmp_path / "bench.log").read_text()
    out = tmp_path / "out"
    assert f"bench/modular_host_cost.py --dp 2 --json {out / 'host-cost.json'} (in {REPO})" in bench
    assert (out / "host-cost.md").read_text().startswith("verdict: stub")
    assert summary(tmp_path) == ["host-cost: exit 0"]


def test_a_part_resumes_from_a_returned_tarball(stubs: Path, tmp_path: Path) -> None:
    fake_before(tmp_path)
    assert run(stubs, tmp_path, "ab-modular").returncode == 0
    returned = tmp_path / "returned.tar.gz"
    (tmp_path / "out" / "ab-modular.tar.gz").rename(returned)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    result = run(stubs, fresh, "repeat", RESUME_FROM=str(returned))
    assert result.returncode == 0, result.stderr
    assert (fresh / "root" / "ab-modular" / "after-modular-f2" / "run.log").is_file()
    assert "resumed state from" in (fresh / "out" / "repeat.log").read_text()


def test_nothing_to_run_exits_2(stubs: Path, tmp_path: Path) -> None:
    result = run(stubs, tmp_path, "bogus")
    assert result.returncode == 2
    assert "unknown part bogus" in result.stdout
