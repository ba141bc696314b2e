#!/usr/bin/env bash
# Issue 4, item 8: the torch-reference bundle of the Qwen3-30B-A3B geometry on one H200,
# TP1/DP1 and TP1/DP2/EP2 (ranks 0 and 1), --moe-rounds 3 --measurement-iterations 3.
#
# Run from the repository root on the GPU machine:
#   bash scripts/h200_torch_reference.sh [STATE.tar.gz]
#
# The acquisition is resumable and each device command is limited in time, so the script runs
# it for at most BUDGET_S seconds (default 540), stops it with SIGTERM (samples are kept), and
# packs the whole --out-root into $OUT/h200_state.tar.gz. Pass that file back (carried into
# the tree) to the next call to continue; when every target is published, $OUT also holds
# h200_bundle.tar.gz (runtime files only: meta.yaml and components.csv) to unpack under
# bundles/, and h200_samples.tar.gz (the raw checkpoint, kept outside the bundle).
#
# Capture sizes: the serving deployment is described with power-of-two captures up to 256
# (--cudagraph-capture-sizes), which puts capture points on the factor-2 grid. vLLM's
# derived default list (1, 2, 4, 8, 16, 24, ..., 256) would triple the DP2 expert plan.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-var/h200-out}
ROOT=${ROOT:-var/h200-torch-reference}
BUDGET_S=${BUDGET_S:-540}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR" "$ROOT"
if [ -n "${1:-}" ]; then
  tar -xzf "$1" -C "$ROOT"
fi
export PYTHONUNBUFFERED=1
started=$(date +%s)
timeout --signal=TERM --kill-after=60 "$BUDGET_S" "$PYTHON" -m acquisition slice \
  Qwen/Qwen3-30B-A3B-Instruct-2507 \
  --hardware H200 --tp 1 --tp-refresh 1 --group moe --dp 1,2 \
  --max-num-batched-tokens 2048 --max-num-seqs 128 \
  --moe-rounds 3 --measurement-iterations 3 \
  --cudagraph-capture-sizes 1,2,4,8,16,32,64,128,256 \
  --backend torch-reference --device cuda \
  --out-root "$ROOT" --progress-json "$ROOT/progress.jsonl" --no-progress-bar \
  >>"$ROOT/acquisition.log" 2>&1
status=$?
echo "acquisition exit status $status after $(( $(date +%s) - started ))s" | tee -a "$ROOT/acquisition.log"
tail -n 5 "$ROOT/acquisition.log"
tail -n 1 "$ROOT/progress.jsonl"
tar -czf "$OUT_DIR/h200_state.tar.gz" -C "$ROOT" .
if [ "$status" -eq 0 ]; then
  tar -czf "$OUT_DIR/h200_bundle.tar.gz" -C "$ROOT" H200
  tar -czf "$OUT_DIR/h200_samples.tar.gz" -C "$ROOT" _acquisition
  "$PYTHON" - "$ROOT" <<'EOF'
import sys
from moetables.bundle import validate_bundle
report = validate_bundle(f"{sys.argv[1]}/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16")
print("bundle valid:", report.ok, report.problems[:3])
EOF
fi
cp "$ROOT/progress.jsonl" "$ROOT/acquisition.log" "$OUT_DIR/" 2>/dev/null || true
exit "$status"
