"""scripts/h200_spread_rest.sh on CPU (issue 18's remaining GPU parts): which commands each part
runs (FP8 under VLLM_USE_DEEP_GEMM=0 and only there, the TP1 engine with its own router), the
limits, and that the archive is repacked after every part so a stopped call returns what ran.

``nvidia-smi`` is the stand-in of ``script_stubs``; ``python3`` is replaced by one that fakes the
load-spread script and the engine validation.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from script_stubs import make_stubs, members, run_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200_spread_rest.sh"

# python3 stand-in: versions; the load-spread script writes its JSON (or sleeps past its limit
# when STUB_SLOW names its output); the validation writes validation/<routing>/rank0.json.
PYTHON = r"""#!/usr/bin/env bash
if [ "$1" = -c ]; then echo "2.11.0 0.26.0"; exit 0; fi
echo "$* VLLM_USE_DEEP_GEMM=${VLLM_USE_DEEP_GEMM-unset}" >> "$ROOT/argv.txt"
case $1 in
  scripts/h200_load_spread.py)
    case $2 in *"$STUB_SLOW"*) sleep 30 ;; esac
    echo '{"meta": {}, "results": []}' > "$2" ;;
  scripts/h200x2_estimate_validation.py)
    while [ $# -gt 0 ]; do
      case $1 in --out) out=$2; shift ;; --routing) routing=$2; shift ;; esac; shift
    done
    mkdir -p "$out/$routing" && echo '{"rank": 0, "ok": true}' > "$out/$routing/rank0.json"
    echo "rank 0 ok" ;;
esac
"""


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    bin_dir = make_stubs(tmp_path)
    (bin_dir / "python3").write_text(PYTHON)
    return bin_dir


def run(stubs: Path, tmp_path: Path, *parts: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_script(SCRIPT, stubs, tmp_path, *parts, **env)


def argv(tmp_path: Path) -> list[str]:
    return (tmp_path / "root" / "argv.txt").read_text().splitlines()


def test_all_runs_fp8_spread_then_the_native_engine_then_bf16_small_blocks(
    stubs: Path, tmp_path: Path
) -> None:
    result = run(stubs, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = argv(tmp_path)
    assert len(lines) == 3
    fp8, native, small = lines
    assert fp8.startswith("scripts/h200_load_spread.py ")
    assert "--dtype fp8 --deployments tp1 --tokens 128,256,512,1024,1536,2048" in fp8
    assert fp8.endswith("VLLM_USE_DEEP_GEMM=0")
    # The bf16 engine runs as the earlier TP1 parts did: DeepGEMM left as vLLM sets it.
    assert native.startswith("scripts/h200x2_estimate_validation.py run --dp 1 --routing native")
    assert "--reps 3" in native and native.endswith("VLLM_USE_DEEP_GEMM=unset")
    assert "--dtype" not in small and "--tokens 64,128,200,384,512,640" in small
    assert small.endswith("VLLM_USE_DEEP_GEMM=unset")
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [s.split(":")[0] for s in summary] == ["fp8-spread", "tp1-native", "bf16-small"]
    assert all(": exit 0 after" in s for s in summary)
    packed = members(tmp_path / "out" / "spread-rest.tar.gz")
    assert {
        "root/load_spread_fp8.json",
        "root/load_spread_bf16_small.json",
        "root/tp1-native/validation/native/rank0.json",
        "root/gpus.csv",
        "root/spread-rest.log",
    } <= packed
    log = (tmp_path / "out" / "spread-rest.log").read_text()
    assert "tp1-native: native: rc=0" in log


def test_a_part_past_its_limit_is_stopped_and_what_ran_still_comes_back(
    stubs: Path, tmp_path: Path
) -> None:
    result = run(
        stubs, tmp_path, "fp8-spread", "tp1-native", "bogus",
        STUB_SLOW="load_spread_fp8", FP8_SPREAD_S="1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("fp8-spread: exit 124")
    assert summary[1].startswith("tp1-native: exit 0")
    assert "unknown part bogus" in (tmp_path / "out" / "spread-rest.log").read_text()
    packed = members(tmp_path / "out" / "spread-rest.tar.gz")
    assert "root/tp1-native/validation/native/rank0.json" in packed
    assert "root/load_spread_fp8.log" in packed


def test_the_fp8_record_is_readable_after_unpacking(stubs: Path, tmp_path: Path) -> None:
    assert run(stubs, tmp_path, "fp8-spread").returncode == 0
    with tarfile.open(tmp_path / "out" / "spread-rest.tar.gz") as tar:
        f = tar.extractfile("root/load_spread_fp8.json")
        assert f is not None
        assert json.load(f) == {"meta": {}, "results": []}


def test_ranks_times_the_fp8_dp2_kernel_then_bf16_ep2_small_blocks_ep4_and_ep8(
    stubs: Path, tmp_path: Path
) -> None:
    """Issue 18 part 1, session 11: the deployments the earlier runs left without a tile model."""
    result = run(stubs, tmp_path, "ranks")
    assert result.returncode == 0, result.stderr
    fp8, small, ep4, ep8 = argv(tmp_path)
    assert "--dtype fp8 --deployments ep2 --tokens 64,128,256,512,1024,2048,3072,4096" in fp8
    assert fp8.endswith("VLLM_USE_DEEP_GEMM=0")
    assert "load_spread_bf16_ep2_small.json --deployments ep2 --tokens 24,64,96" in small
    assert "load_spread_bf16_ep4.json --deployments ep4 --tokens 64,256" in ep4
    assert "load_spread_bf16_ep8.json --deployments ep8 --tokens 128,512" in ep8
    # Only FP8 turns DeepGEMM off, as for the shipped FP8 tables.
    assert all(line.endswith("VLLM_USE_DEEP_GEMM=unset") for line in (small, ep4, ep8))
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [s.split(":")[0] for s in summary] == ["fp8-ep2", "ep2-small", "ep4", "ep8"]
    packed = members(tmp_path / "out" / "spread-rest.tar.gz")
    assert {
        "root/load_spread_fp8_ep2.json",
        "root/load_spread_bf16_ep2_small.json",
        "root/load_spread_bf16_ep4.json",
        "root/load_spread_bf16_ep8.json",
    } <= packed


def test_the_load_spread_script_refuses_an_unknown_deployment_by_name() -> None:
    script = SCRIPT.parent / "h200_load_spread.py"

    def refused(deployments: str) -> str:
        result = subprocess.run(
            ["python3", str(script), "/tmp/never.json", "--deployments", deployments],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 2
        return result.stderr

    assert "ep3: 128 experts do not divide over 3 ranks" in refused("tp1,ep3")
    assert "unknown deployment 'dp2'" in refused("tp1,dp2")
