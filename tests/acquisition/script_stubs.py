"""Stand-ins for running the device scripts (scripts/h200_models.sh, scripts/h200_next.sh) on CPU.

``python3`` and ``nvidia-smi`` are stubs on PATH (``python3 bench/...`` is recorded and answered
``verdict: stub``). The stub acquisition records its argv, its
Triton cache and ``VLLM_USE_DEEP_GEMM`` in ``argv.txt`` beside its out-root, writes a
``components.csv`` per deployment of its ``--dp`` into ``--out-root`` (or sleeps past its limit
when ``STUB_SLOW`` names its model/backend), so what a script does around the acquisitions runs
as on the device.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

# python3 stand-in: `-c ...` prints versions; `-m acquisition slice MODEL ...` fakes a run.
STUB = r"""#!/usr/bin/env bash
if [ "$1" = -c ]; then echo "torch stub vllm stub"; exit 0; fi
# `python3 bench/X.py ...`: recorded in $STUB_BENCH_LOG (with the directory it ran in), an
# answer printed, exit $STUB_BENCH_EXIT (default 0).
case $1 in bench/*)
  echo "$* (in $PWD)" >> "${STUB_BENCH_LOG:-/dev/null}"
  echo "verdict: stub"
  exit "${STUB_BENCH_EXIT:-0}" ;;
esac
all="$*"
shift 3
model=$1; shift
while [ $# -gt 0 ]; do
  case $1 in
    --out-root) out=$2; shift ;;
    --dp) dps=$2; shift ;;
    --backend) backend=$2; shift ;;
    --progress-json) progress=$2; shift ;;
  esac
  shift
done
echo "$all PWD=$PWD TRITON_CACHE_DIR=$TRITON_CACHE_DIR VLLM_USE_DEEP_GEMM=${VLLM_USE_DEEP_GEMM-unset}" \
  >> "$(dirname "$out")/argv.txt"
case "$model/$backend" in *"$STUB_SLOW"*) sleep 30 ;; esac
for dp in ${dps//,/ }; do
  for rank in $(seq 0 $((dp - 1))); do
    d="$out/H200/$model/bf16/tp1/moe_components/dp${dp}_ep${dp}_rank${rank}_sp0"
    mkdir -p "$d" && echo "component,mode,tokens" > "$d/components.csv"
    touch "$d/writer.lock"
  done
done
echo '{"event": "done"}' >> "$progress"
echo "published"
"""


def make_stubs(tmp_path: Path, python3: str = STUB) -> Path:
    """A PATH folder with the ``python3`` (``STUB`` unless given) and ``nvidia-smi``
    stand-ins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(python3)
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'name, uuid'\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    return bin_dir


def run_script(
    script: Path, stubs: Path, tmp_path: Path, *parts: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """``bash script parts...`` with the stubs first on PATH and OUT/ROOT under ``tmp_path``."""
    environment = {
        **{k: v for k, v in os.environ.items() if k != "VLLM_USE_DEEP_GEMM"},
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "OUT": str(tmp_path / "out"),
        "ROOT": str(tmp_path / "root"),
        "STUB_SLOW": "none",
        **env,
    }
    return subprocess.run(
        ["bash", str(script), *parts],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def members(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}
