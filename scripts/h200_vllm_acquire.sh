#!/usr/bin/env bash
# Issue 5, item 6: the H200 bundle of Qwen3-30B-A3B-Instruct-2507 (bf16) with the vLLM adapters:
# vllm-modular for TP1/DP1 and TP1/DP2/EP2 (ranks 0 and 1), vllm-live for TP1.
#
# Run from the repository root on the GPU machine with the kit staged and env.sh sourced:
#   [FACTOR=2] [DPS=1,2] [MODULAR_S=330] [LIVE_S=200] [SKIP_PROBE|SKIP_MODULAR|SKIP_LIVE=1] \
#     bash scripts/h200_vllm_acquire.sh
# The 2026-11-30 bundles used FACTOR=8 (device time); docs/h200-runs.md has the exact calls.
# The two adapters measure the same TP1/DP1 deployment, so each has its own --out-root
# ($ROOT/modular, $ROOT/live): one bundle holds one entry per deployment. Each acquisition runs
# at most its budget and resumes when the same command runs again on the same (warm) machine.
# $OUT receives:
#   probe.json probe.log   the live API shapes of this vLLM (scripts/h200_vllm_probe.py)
#   acquire.log            this script's own log (commands, exit status, wall times)
#   modular.log live.log   the acquisition logs
#   bundle.tar.gz          the bundles (runtime files only): modular/H200/..., live/H200/...
#   samples.tar.gz         the raw checkpoints: {modular,live}/_acquisition (samples, plans)
#   progress.tar.gz        progress.jsonl of both runs
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-var/h200-vllm-out}
ROOT=${ROOT:-/tmp/h200-vllm}
FACTOR=${FACTOR:-2}
CAPTURES=${CAPTURES:-1,2,4,8,16,32,64,128,256}
MODULAR_S=${MODULAR_S:-330}
LIVE_S=${LIVE_S:-200}
DPS=${DPS:-1,2}
mkdir -p "$OUT_DIR" "$ROOT"
export PYTHONUNBUFFERED=1
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT_DIR/acquire.log"; }
common=(Qwen/Qwen3-30B-A3B-Instruct-2507 --hardware H200 --tp 1 --tp-refresh 1 --group moe
  --max-num-batched-tokens 2048 --max-num-seqs 128
  --moe-rounds 3 --measurement-iterations 3 --moe-grid-factor "$FACTOR"
  --cudagraph-capture-sizes "$CAPTURES" --no-progress-bar)
mkdir -p "$ROOT/modular" "$ROOT/live"
if [ "${SKIP_PROBE:-0}" != 1 ]; then
  python3 scripts/h200_vllm_probe.py "$OUT_DIR" >"$OUT_DIR/probe.log" 2>&1
  log "probe exit $?"
fi
if [ "${SKIP_MODULAR:-0}" != 1 ]; then
  cmd=(python3 -m acquisition.adapters.vllm_cli slice "${common[@]}" --dp "$DPS"
    --backend vllm-modular --out-root "$ROOT/modular" --progress-json "$ROOT/progress-modular.jsonl")
  log "run (limit ${MODULAR_S}s): ${cmd[*]}"
  start=$(date +%s)
  timeout --signal=TERM --kill-after=30 "$MODULAR_S" "${cmd[@]}" >>"$OUT_DIR/modular.log" 2>&1
  log "modular exit $? after $(( $(date +%s) - start ))s"
fi
if [ "${SKIP_LIVE:-0}" != 1 ]; then
  cmd=(python3 -m acquisition.adapters.vllm_cli slice "${common[@]}" --dp 1
    --backend vllm-live --engine-attention-backend TRITON_ATTN --out-root "$ROOT/live"
    --progress-json "$ROOT/progress-live.jsonl")
  log "run (limit ${LIVE_S}s): ${cmd[*]}"
  start=$(date +%s)
  timeout --signal=TERM --kill-after=30 "$LIVE_S" "${cmd[@]}" >>"$OUT_DIR/live.log" 2>&1
  log "live exit $? after $(( $(date +%s) - start ))s"
fi
bundles=$(cd "$ROOT" && ls -d */H200 2>/dev/null)
[ -n "$bundles" ] && tar -czf "$OUT_DIR/bundle.tar.gz" -C "$ROOT" $bundles
samples=$(cd "$ROOT" && ls -d */_acquisition 2>/dev/null)
[ -n "$samples" ] && tar -czf "$OUT_DIR/samples.tar.gz" -C "$ROOT" --exclude=writer.lock $samples
tar -czf "$OUT_DIR/progress.tar.gz" -C "$ROOT" $(cd "$ROOT" && ls progress-*.jsonl 2>/dev/null)
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv >>"$OUT_DIR/acquire.log" 2>&1
log "done"
