"""scripts/h200_models.sh on CPU: parts, per-part timeouts, packing after each part, resume.

``python3`` and ``nvidia-smi`` are the stand-ins of ``script_stubs``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from script_stubs import make_stubs, members, run_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200_models.sh"


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    return make_stubs(tmp_path)


def run(stubs: Path, tmp_path: Path, *parts: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_script(SCRIPT, stubs, tmp_path, *parts, **env)


def test_a_model_part_runs_both_adapters_and_packs_small(stubs: Path, tmp_path: Path) -> None:
    result = run(stubs, tmp_path, "qwen15")
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("qwen15-modular: exit 0")
    assert "dp1_ep1_rank0_sp0 tp1/moe_components/dp2_ep2_rank0_sp0" in summary[0]
    assert "dp2_ep2_rank1_sp0" in summary[0]
    assert summary[1].startswith("qwen15-live: exit 0")
    assert summary[1].endswith("published: tp1/moe_components/dp1_ep1_rank0_sp0 ")
    packed = members(tmp_path / "out" / "runs.tar.gz")
    tail = "out/H200/Qwen/Qwen1.5-MoE-A2.7B/bf16/tp1/moe_components"
    assert f"qwen15-modular/{tail}/dp2_ep2_rank1_sp0/components.csv" in packed
    assert f"qwen15-live/{tail}/dp1_ep1_rank0_sp0/components.csv" in packed
    assert not any(name.endswith("writer.lock") for name in packed)
    argv = (tmp_path / "root" / "qwen15-modular" / "argv.txt").read_text()
    assert "slice Qwen/Qwen1.5-MoE-A2.7B " in argv and "--backend vllm-modular" in argv
    assert f"TRITON_CACHE_DIR={tmp_path / 'root' / 'triton'} " in argv  # one cache per call


def test_a_part_past_its_limit_is_stopped_and_the_next_part_still_runs(
    stubs: Path, tmp_path: Path
) -> None:
    result = run(
        stubs,
        tmp_path,
        "mixtral-live",
        "mixtral-modular",
        "bogus",
        STUB_SLOW="Instruct-v0.1/vllm-live",
        MIXTRAL_LIVE_S="1",
    )
    assert "unknown part bogus" in result.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("mixtral-live: exit 124")
    assert summary[1].startswith("mixtral-modular: exit 0")
    # Packed after each part: the archive holds the stopped part's log too.
    assert "mixtral-live/run.log" in members(tmp_path / "out" / "runs.tar.gz")


def test_a_later_call_resumes_from_the_packed_state(stubs: Path, tmp_path: Path) -> None:
    run(stubs, tmp_path, "qwen15-live")
    first = tmp_path / "first.tar.gz"
    (tmp_path / "out" / "runs.tar.gz").rename(first)
    later = tmp_path / "later"
    result = run(
        stubs,
        later,
        "mixtral",
        RESUME_FROM=str(first),
    )
    assert result.returncode == 0, result.stderr
    assert f"resumed state from {first}" in result.stdout
    packed = members(later / "out" / "runs.tar.gz")
    # The earlier part's state travels on with the new parts.
    assert any(name.startswith("qwen15-live/out/H200/") for name in packed)
    assert any(name.startswith("mixtral-modular/out/H200/") for name in packed)


def test_nothing_to_run_is_an_error(stubs: Path, tmp_path: Path) -> None:
    assert run(stubs, tmp_path).returncode == 2


def test_more_measures_the_catalogs_other_models_with_the_default_plan(
    stubs: Path, tmp_path: Path
) -> None:
    result = run(stubs, tmp_path, "more")
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == [
        "q235-modular",
        "dsv2-modular",
        "olmoe-modular",
        "olmoe-live",
    ]
    assert all(": exit 0 " in line for line in summary)
    argv = {
        part: (tmp_path / "root" / part / "argv.txt").read_text()
        for part in ("q235-modular", "dsv2-modular", "olmoe-modular", "olmoe-live")
    }
    assert "slice Qwen/Qwen3-235B-A22B " in argv["q235-modular"]
    assert "slice deepseek-ai/DeepSeek-V2-Lite " in argv["dsv2-modular"]
    for part, text in argv.items():
        # New tables take the default plan; the older parts keep theirs (off) to resume.
        assert "--moe-kernel-steps auto" in text and "--dp 1 " in text, part
    # OLMoE's config names no dtype; the live part keeps its attention backend too.
    assert "--dtype bfloat16" in argv["olmoe-modular"]
    assert "--dtype bfloat16" in argv["olmoe-live"]
    assert "--engine-attention-backend TRITON_ATTN" in argv["olmoe-live"]
    assert "--dtype" not in argv["q235-modular"]
    old = run(stubs, tmp_path / "old", "qwen15-live")
    assert old.returncode == 0
    assert (
        "--moe-kernel-steps off"
        in (tmp_path / "old" / "root" / "qwen15-live" / "argv.txt").read_text()
    )
