"""The FP8 device script and its probe fail soft (issue 20, item 4): on a machine where the
adapter path breaks (here: no vLLM, no GPU), one call still leaves a log, a probe report naming
every step's error, and the packed run root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEPS = ("versions", "packages", "surfaces", "oracle", "dp1_session", "dp2_rank0_session")


def test_the_probe_records_every_step_even_when_each_fails(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/h200_fp8_probe.py", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "fp8_probe.json").read_text())
    assert report["model"] == "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8"
    for step in STEPS:
        assert step in report, step
        assert "seconds" in report[step]
    # Without vLLM the surfaces step still answers: every symbol is named as missing.
    missing = report["surfaces"]["value"]["missing"]
    assert any("select_fp8_moe_backend" in m for m in missing)
    assert report["versions"]["ok"] is False and "traceback" in report["versions"]
    assert "failed steps" in done.stdout


def test_the_script_runs_its_parts_under_timeouts_and_packs_the_root(tmp_path: Path) -> None:
    out, root = tmp_path / "out", tmp_path / "root"
    env = {
        **os.environ,
        "OUT": str(out),
        "ROOT": str(root),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MODULAR_S": "60",
        "VLLM_USE_DEEP_GEMM": "0",
    }
    env.pop("VLLM_MOE_USE_DEEP_GEMM", None)
    done = subprocess.run(
        ["bash", "scripts/h200_fp8.sh", "probe", "modular", "nonsense"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    log = (out / "fp8.log").read_text()
    assert "probe: exit 0" in log
    # The oracle's switches are part of the run's record (the 2026-12-01 run needed one).
    assert "environment: VLLM_USE_DEEP_GEMM=0 VLLM_MOE_USE_DEEP_GEMM=unset" in log
    # The modular part ran the acquisition command (it declines here: no GPU, no vLLM).
    assert (
        "modular (limit 60s): python3 -m acquisition slice Qwen/Qwen3-30B-A3B-Instruct-2507-FP8"
        in log
    )
    assert "--moe-grid-factor 2" in log and "--dp 1,2 --backend vllm-modular" in log
    assert "unknown part nonsense" in log
    assert (out / "fp8_probe.json").is_file() and (out / "modular.log").is_file()
    with tarfile.open(out / "runs.tar.gz") as packed:
        assert any(name.endswith("modular") for name in packed.getnames())
