#!/usr/bin/env bash
# Issue 14: conservation evidence of the vllm-modular (and torch-reference) tables on one H200.
#
# Each SPEC is BACKEND:FACTOR:DPS:LIMIT_S; the default is one short modular acquisition,
#   vllm-modular:8:1:170   (Qwen3-30B-A3B bf16, TP1/DP1, grid factor 8, about 1-2 minutes).
# Each run is the docs/h200-runs.md slice (3 rounds x 3 iterations, 2048 tokens, 128 sequences,
# captures 1..256 in powers of two) in a fresh --out-root, stopped with SIGTERM after LIMIT_S.
# The build traces the whole modular path at 1, 256 and 2048 local rows (DP1: gate + router
# and vLLM's FusedMoEKernel.apply with prepare/experts/finalize scoped; DP+EP: the components
# composed in one window) and the published bundle carries them as conservation.csv.
#
# Run on the GPU machine from the repository root, kit staged:
#   bash .kit/bin/stage.sh && source .kit/bin/env.sh && bash scripts/h200_conservation.sh \
#     [vllm-modular:8:1:170 [torch-reference:8:1,2:150 ...]]
# $OUT receives conservation.log (the rows per table and forward, printed at the end too),
# conservation-<label>.json (scripts/h200_conservation.py --json), and bundles.tar.gz (each
# run's published bundle: meta.yaml, components.csv, stability.csv, conservation.csv).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-var/conservation-out}
ROOT=${ROOT:-/tmp/conservation}
PYTHON=${PYTHON:-python3}
CAPTURES=${CAPTURES:-1,2,4,8,16,32,64,128,256}
mkdir -p "$OUT_DIR" "$ROOT"
export PYTHONUNBUFFERED=1
# The summary script imports moetables from this tree.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT_DIR/conservation.log"; }
[ "$#" -gt 0 ] || set -- vllm-modular:8:1:170
status_all=0
for spec in "$@"; do
  IFS=: read -r backend factor dps limit <<<"$spec"
  label="$backend-f$factor-dp${dps//,/_}"
  run=$ROOT/$label
  rm -rf "$run" && mkdir -p "$run"
  cmd=("$PYTHON" -m acquisition slice Qwen/Qwen3-30B-A3B-Instruct-2507
    --hardware H200 --tp 1 --tp-refresh 1 --group moe --dp "$dps"
    --max-num-batched-tokens 2048 --max-num-seqs 128 --moe-rounds 3 --measurement-iterations 3
    --moe-grid-factor "$factor" --cudagraph-capture-sizes "$CAPTURES" --backend "$backend"
    --out-root "$run/out" --progress-json "$run/progress.jsonl" --no-progress-bar)
  log "$label: timeout $limit ${cmd[*]}"
  start=$(date +%s)
  timeout --signal=TERM --kill-after=20 "$limit" "${cmd[@]}" >>"$run/run.log" 2>&1
  status=$?
  log "$label: exit $status after $(( $(date +%s) - start ))s; $(tail -n 1 "$run/run.log" | cut -c1-200)"
  bundle="$run/out/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
  if [ -f "$bundle/meta.yaml" ]; then
    "$PYTHON" scripts/h200_conservation.py "$bundle" --json "$OUT_DIR/conservation-$label.json" \
      2>&1 | tee -a "$OUT_DIR/conservation.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status_all=1
  else
    log "$label: no bundle published (see run.log)"
    grep -E "Error|error|declined" "$run/run.log" | tail -n 5 | tee -a "$OUT_DIR/conservation.log"
    status_all=1
  fi
  cp "$run/run.log" "$OUT_DIR/run-$label.log" 2>/dev/null || true
done
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv >>"$OUT_DIR/conservation.log" 2>&1
tar -czf "$OUT_DIR/bundles.tar.gz" -C "$ROOT" --exclude=_acquisition --exclude=writer.lock \
  --exclude=.meta.lock . 2>/dev/null
log "summary (exit $status_all):"
grep -E "^==|^   tokens|outside the scopes|no traced|exit [0-9]|no bundle" "$OUT_DIR/conservation.log" | tail -n 40
exit "$status_all"
