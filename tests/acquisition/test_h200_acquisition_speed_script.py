"""scripts/h200_acquisition_speed.sh on CPU: the command line each LABEL=... spec becomes.

``python3`` and ``nvidia-smi`` are stubs on PATH; the stub acquisition records its arguments.
The optional sixth field of a spec is the target's TP degree (issue 20 item 3: TP2/DP1/EP2
ranks on one GPU), which must reach the acquisition as ``--tp 1,2 --tp-refresh 2`` (R6: TP1
stays in the session list; the slice measures only the refreshed degree).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from script_stubs import make_stubs

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200_acquisition_speed.sh"

# python3 stand-ins: `-` (the bytecode census) and `-c` (versions) print a line; a run
# (`-m acquisition.adapters.vllm_cli slice ...`) appends its arguments to $ARGV_LOG.
_NOT_A_RUN = r"""#!/usr/bin/env bash
case $1 in
  -) cat >/dev/null; echo "stub census"; exit 0 ;;
  -c) echo "torch stub vllm stub"; exit 0 ;;
esac
"""
STUB = _NOT_A_RUN + 'echo "$*" >> "$ARGV_LOG"\necho "published"\n'


def _run(tmp_path: Path, python3: str, specs: list[str], **env: str) -> Path:
    """The script over ``specs`` (``{project}``: a stand-in project copy) with ``python3``
    stubbed; the stub's argument log."""
    stubs = make_stubs(tmp_path, python3)
    project = tmp_path / "project"
    (project / "acquisition").mkdir(parents=True)
    log = tmp_path / "argv.log"
    environment = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "OUT": str(tmp_path / "out"),
        "ROOT": str(tmp_path / "root"),
        "ARGV_LOG": str(log),
        **env,
    }
    result = subprocess.run(
        ["bash", str(SCRIPT), *(spec.format(project=project) for spec in specs)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return log


def test_a_sixth_field_slices_that_tp_degree_and_others_stay_tp1(tmp_path: Path) -> None:
    log = _run(
        tmp_path,
        STUB,
        ["tp2={project}:vllm-modular:2:1:60:2", "dp2={project}:vllm-modular:2:2:60"],
        EXTRA_ARGS="--moe-kernel-steps off",
    )
    tp2, dp2 = (line.split() for line in log.read_text().splitlines())

    def value(argv: list[str], flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert (value(tp2, "--tp"), value(tp2, "--tp-refresh"), value(tp2, "--dp")) == ("1,2", "2", "1")
    assert (value(dp2, "--tp"), value(dp2, "--tp-refresh"), value(dp2, "--dp")) == ("1", "1", "2")
    for argv in (tp2, dp2):
        assert argv.count("--tp") == 1
        assert value(argv, "--moe-grid-factor") == "2"
        assert value(argv, "--backend") == "vllm-modular"
        assert value(argv, "--moe-kernel-steps") == "off"
    assert value(tp2, "--out-root") == str(tmp_path / "root" / "tp2" / "out")
    speed_log = (tmp_path / "out" / "speed.log").read_text()
    assert "tp2: exit 0" in speed_log and "dp2: exit 0" in speed_log


# For PARALLEL=1: a run notes when it starts and ends (each sleeps 1 s), so overlapping
# intervals show that the runs ran at once.
PARALLEL_STUB = (
    _NOT_A_RUN
    + r"""echo "start $(date +%s%N) $*" >> "$ARGV_LOG"
sleep 1
echo "end $(date +%s%N)" >> "$ARGV_LOG"
echo "published"
"""
)


def test_parallel_runs_start_together_and_each_names_its_target(tmp_path: Path) -> None:
    """PARALLEL=1 (session 10's side-by-side experiment): every spec's run starts before any
    ends, a seventh field reaches the run as --only-target, and each exit is logged."""
    log = _run(
        tmp_path,
        PARALLEL_STUB,
        [
            "a={project}:vllm-modular:2:2:60::tp1/dp2_ep2_rank0_sp0",
            "b={project}:vllm-modular:2:2:60::tp1/dp2_ep2_rank1_sp0",
        ],
        PARALLEL="1",
    )
    lines = log.read_text().splitlines()
    starts = [int(line.split()[1]) for line in lines if line.startswith("start")]
    ends = [int(line.split()[1]) for line in lines if line.startswith("end")]
    assert len(starts) == len(ends) == 2
    assert max(starts) < min(ends), "the second run started only after the first ended"
    targets = sorted(
        line.split("--only-target")[1].split()[0] for line in lines if line.startswith("start")
    )
    assert targets == ["tp1/dp2_ep2_rank0_sp0", "tp1/dp2_ep2_rank1_sp0"]
    speed_log = (tmp_path / "out" / "speed.log").read_text()
    assert "a: exit 0" in speed_log and "b: exit 0" in speed_log
    assert "parallel runs: all ended" in speed_log
