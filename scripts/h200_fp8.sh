#!/usr/bin/env bash
# Issue 20, item 4: Qwen3-30B-A3B-Instruct-2507-FP8 (block-wise FP8) on one H200.
#
# Run on the GPU machine with the kit staged and env.sh sourced, from the repository root:
#   [FACTOR=2] [MODULAR_S=420] [MODULAR_DPS=1,2] [LIVE_S=240] [KERNEL_STEPS=off] [ROOT=/tmp/h200-fp8] [RESUME_FROM=runs.tar.gz] \
#     bash scripts/h200_fp8.sh [probe] [modular] [live]          (default: probe modular)
# Parts, with their expected wall time on a warm H200 (each also bounded by its own timeout):
#   probe    ~1-2 min   scripts/h200_fp8_probe.py: imports, the FP8 oracle's choice for
#                       TP1/DP1 and TP1/DP2/EP2 ranks 0 and 1 (and why the others declined),
#                       one forward of a built DP1 and DP2 rank 0 session; fail-soft
#                       ($OUT/fp8_probe.json is rewritten after every step)
#   modular  ~4-6 min   vllm-modular TP1/DP1 and TP1/DP2/EP2 ranks 0 and 1 (--dp 1,2); the bf16
#                       factor-2 run measured 1,424 points in 186 s, FP8 adds the dispatch_quant
#                       rows of both DP2 ranks and the FP8 Triton compilations
#   live     ~2-4 min   vllm-live TP1 (engine start with dummy FP8 weights, TRITON_ATTN)
# With the staged kit, export VLLM_USE_DEEP_GEMM=0 first: vLLM's oracle picks DeepGEMM for DP+EP
# and for the engine's dense FP8 layers, and the kit lacks DeepGEMM's JIT headers (2026-12-01).
# One device call holds at most 600 s: `probe modular` in one call, `live` in the next.
# Every acquisition resumes from its checkpoint: a part stopped by its timeout continues when
# the same part runs again with the same ROOT (warm machine) or with RESUME_FROM=<the previous
# call's runs.tar.gz, carried into the working tree> (fresh machine). If FACTOR=2 does not finish
# in two modular calls, FACTOR=4 is the fallback (a new ROOT: another factor is another plan).
# $OUT receives: fp8.log (this script: commands, exits, wall times), fp8_probe.json, probe.log,
# modular.log, live.log, runs.tar.gz (per adapter: the bundle's runtime files, the
# _acquisition checkpoint without writer locks, progress.jsonl, phases.jsonl) and versions.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-var/h200-fp8-out}
ROOT=${ROOT:-/tmp/h200-fp8}
FACTOR=${FACTOR:-2}
MODULAR_S=${MODULAR_S:-420}
LIVE_S=${LIVE_S:-240}
MODULAR_DPS=${MODULAR_DPS:-1,2}  # e.g. 1: re-measure DP1 alone (with a fresh ROOT)
PROBE_S=${PROBE_S:-150}
CAPTURES=${CAPTURES:-1,2,4,8,16,32,64,128,256}
# off: the plan of the shipped FP8 bundles and their checkpoints (measured before the kernel-step
# rule, which is now on by default for block FP8 on the H200; a checkpoint refuses another plan).
KERNEL_STEPS=${KERNEL_STEPS:-off}
MODEL=Qwen/Qwen3-30B-A3B-Instruct-2507-FP8
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(probe modular)
mkdir -p "$OUT_DIR" "$ROOT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT_DIR/fp8.log"; }
# vLLM's FP8 oracle reads these before choosing (oracle/fp8.py); the kit staged here lacks
# DeepGEMM's JIT headers, so DP+EP and live runs set VLLM_USE_DEEP_GEMM=0 (docs/acquisition.md).
log "environment: VLLM_USE_DEEP_GEMM=${VLLM_USE_DEEP_GEMM-unset}" \
  "VLLM_MOE_USE_DEEP_GEMM=${VLLM_MOE_USE_DEEP_GEMM-unset}" \
  "VLLM_TEST_FORCE_FP8_MARLIN=${VLLM_TEST_FORCE_FP8_MARLIN-unset}"
if [ -n "${RESUME_FROM:-}" ]; then
  if tar -xzf "$RESUME_FROM" -C "$ROOT"; then log "resumed state from $RESUME_FROM"
  else log "could not unpack $RESUME_FROM: starting fresh"; fi
fi
common=("$MODEL" --hardware H200 --tp 1 --tp-refresh 1 --group moe
  --max-num-batched-tokens 2048 --max-num-seqs 128
  --moe-rounds 3 --measurement-iterations 3 --moe-grid-factor "$FACTOR"
  --moe-kernel-steps "$KERNEL_STEPS" --cudagraph-capture-sizes "$CAPTURES" --no-progress-bar)
acquire() {  # label limit_s dps backend [extra args...]
  local label=$1 limit=$2 dps=$3 backend=$4
  shift 4
  local run=$ROOT/$label
  mkdir -p "$run"
  local cmd=(python3 -m acquisition slice "${common[@]}" --dp "$dps" --backend "$backend"
    --out-root "$run/out" --progress-json "$run/progress.jsonl" --phase-log "$run/phases.jsonl"
    "$@")
  log "$label (limit ${limit}s): ${cmd[*]}"
  local start
  start=$(date +%s)
  timeout --signal=TERM --kill-after=30 "$limit" "${cmd[@]}" >>"$OUT_DIR/$label.log" 2>&1
  local status=$?
  log "$label: exit $status after $(( $(date +%s) - start ))s;" \
    "$(tail -n 1 "$OUT_DIR/$label.log" | cut -c1-240)"
}
for part in "${PARTS[@]}"; do
  case "$part" in
    probe)
      start=$(date +%s)
      timeout --signal=TERM --kill-after=20 "$PROBE_S" \
        python3 scripts/h200_fp8_probe.py "$OUT_DIR" >>"$OUT_DIR/probe.log" 2>&1
      log "probe: exit $? after $(( $(date +%s) - start ))s; $(grep 'fp8-probe' "$OUT_DIR/probe.log" | tail -n 1)"
      ;;
    modular) acquire modular "$MODULAR_S" "$MODULAR_DPS" vllm-modular ;;
    live) acquire live "$LIVE_S" 1 vllm-live --engine-attention-backend TRITON_ATTN ;;
    *) log "unknown part $part (probe, modular, live)" ;;
  esac
done
{
  nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv
  python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"
} >>"$OUT_DIR/versions.log" 2>&1
tar -czf "$OUT_DIR/runs.tar.gz" -C "$ROOT" --exclude=writer.lock --exclude=triton \
  --exclude=vllm-cache . && log "packed runs.tar.gz $(du -h "$OUT_DIR/runs.tar.gz" | cut -f1)"
for label in modular live; do
  [ -f "$OUT_DIR/$label.log" ] && log "$label summary: $(grep -E 'published|refused|declined|failed' "$OUT_DIR/$label.log" | tail -n 3 | tr '\n' ' ' | cut -c1-400)"
done
exit 0
