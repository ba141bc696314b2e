#!/usr/bin/env bash
# Issue 20, item 2: two more model families through the vLLM adapters on ONE H200
# (run 2026-12-01, calls 10-12 of the fourth session; docs/h200-runs.md "Two more model families").
#
#   Qwen/Qwen1.5-MoE-A2.7B                (60 experts, top-4, hidden 2048, a gated shared expert)
#   mistralai/Mixtral-8x7B-Instruct-v0.1  (8 experts, top-2, hidden 4096, width 14336)
#
# each with vllm-modular at TP1/DP1 and TP1/DP2/EP2 ranks 0 and 1, and vllm-live at TP1
# (Qwen1.5-MoE's live table has wrapper rows: the shared expert, its sigmoid gate and the sum).
#
# Run on the GPU machine with the kit staged and env.sh sourced, from the repository root:
#   bash scripts/h200_models.sh PART...
# PART: qwen15-modular qwen15-live mixtral-modular mixtral-live, or qwen15 / mixtral (both
# parts of a model) / all. Each part is one `python -m acquisition slice` under its own
# `timeout` (SIGTERM, samples kept: the same command resumes). Estimated wall on one H200
# (factor 2, machine warm, kit staged; docs/h200-runs.md says how):
#   qwen15-modular   1,242 points (68 + 587 + 587)   ~230 s   limit QWEN15_MODULAR_S=330
#   qwen15-live         81 points (13 + 55 + 13)     ~80 s    limit QWEN15_LIVE_S=150
#   mixtral-modular    717 points (49 + 334 + 334)   ~190 s   limit MIXTRAL_MODULAR_S=310
#   mixtral-live        49 points (13 + 36)          ~90 s    limit MIXTRAL_LIVE_S=170
# so `qwen15` fits one 550 s call and `mixtral` another.
#
# `more` (session 12): the catalog's other models at TP1/DP1 with the default plan (kernel
# steps v4), `q235-modular dsv2-modular olmoe-modular olmoe-live`:
#   Qwen/Qwen3-235B-A22B          (128 experts, top-8, hidden 4096, width 1536)   538 points
#   deepseek-ai/DeepSeek-V2-Lite  (64 experts, top-6, width 1408, grouped router) 731 points
#   allenai/OLMoE-1B-7B-0924      (64 experts, top-8, width 1024; bf16 named)     442 points
# limits Q235_MODULAR_S=200 DSV2_MODULAR_S=150 OLMOE_MODULAR_S=110 OLMOE_LIVE_S=120.
#
# Environment: ROOT (default /tmp/models; each part writes $ROOT/<part>/), FACTOR (default 2;
# 4 if device time is short: the plan changes, so use a fresh ROOT), CAPTURES (default
# 1,2,4,8,16,32,64,128,256, the shipped Qwen3 bundles' description), KERNEL_STEPS (default off:
# the plan of the shipped bundles, so their archived checkpoints resume), RESUME_FROM=TARBALL
# (an earlier runs.tar.gz, unpacked into $ROOT first: a part that timed out continues from
# its checkpoint; published targets are skipped), the *_S limits above.
# $OUT receives models.log (commands, exit status, wall, published deployments per part),
# summary.txt and runs.tar.gz, repacked after every part (per part: run.log, progress.jsonl,
# phases.jsonl, the bundle under out/H200/... and the _acquisition checkpoint; no writer
# locks, no compiler caches), so a call stopped between parts still returns what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-var/models-out}
ROOT=${ROOT:-/tmp/models}
FACTOR=${FACTOR:-2}
CAPTURES=${CAPTURES:-1,2,4,8,16,32,64,128,256}
# off: the plan the shipped Qwen1.5/Mixtral bundles and their checkpoints were measured with
# (before the kernel-step rule existed); the checkpoint refuses a resume under another plan.
KERNEL_STEPS=${KERNEL_STEPS:-off}
mkdir -p "$OUT_DIR" "$ROOT"
export PYTHONUNBUFFERED=1
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT_DIR/models.log"; }

if [ -n "${RESUME_FROM:-}" ]; then
  tar -xzf "$RESUME_FROM" -C "$ROOT" && log "resumed state from $RESUME_FROM"
fi

pack() {
  tar -czf "$OUT_DIR/runs.tar.gz" -C "$ROOT" --exclude=writer.lock --exclude=triton \
    --exclude=vllm-cache . && log "packed runs.tar.gz ($(du -h "$OUT_DIR/runs.tar.gz" | cut -f1))"
}

published() { # the deployments a part's bundle holds (one components.csv each)
  find "$ROOT/$1/out/H200" -name components.csv 2>/dev/null |
    sed -E 's#.*/(tp[0-9]+/moe_components/[^/]+)/components.csv#\1#' | sort | tr '\n' ' '
}

part() { # LABEL MODEL BACKEND DPS LIMIT_S [KERNEL_STEPS [EXTRA ARG...]]
  local label=$1 model=$2 backend=$3 dps=$4 limit=$5 steps=${6:-$KERNEL_STEPS}
  shift $(($# < 6 ? $# : 6))
  local run=$ROOT/$label
  mkdir -p "$run"
  local extra=("$@")
  # The kit has no flash-attention: the live component engine runs Triton attention
  # (it never touches the MoE layer).
  [ "$backend" = vllm-live ] && extra+=(--engine-attention-backend TRITON_ATTN)
  local cmd=(python3 -m acquisition slice "$model" --hardware H200 --tp 1 --tp-refresh 1
    --group moe --max-num-batched-tokens 2048 --max-num-seqs 128 --moe-rounds 3
    --measurement-iterations 3 --moe-grid-factor "$FACTOR" --moe-kernel-steps "$steps"
    --cudagraph-capture-sizes "$CAPTURES"
    --no-progress-bar --dp "$dps" --backend "$backend" --out-root "$run/out"
    --progress-json "$run/progress.jsonl" --phase-log "$run/phases.jsonl" "${extra[@]}")
  log "$label: timeout $limit ${cmd[*]}"
  local start status
  start=$(date +%s)
  # One Triton/vLLM cache per call, shared by the parts: the modular and live runs of a
  # model compile the same kernels.
  TRITON_CACHE_DIR="$ROOT/triton" VLLM_CACHE_ROOT="$ROOT/vllm-cache" \
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
    timeout --signal=TERM --kill-after=20 "$limit" "${cmd[@]}" >>"$run/run.log" 2>&1
  status=$?
  local line="$label: exit $status after $(($(date +%s) - start))s; published: $(published "$label")"
  log "$line"
  log "$label: $(tail -n 1 "$run/run.log" | cut -c1-240)"
  echo "$line" >>"$OUT_DIR/summary.txt"
  pack
}

QWEN15=Qwen/Qwen1.5-MoE-A2.7B
MIXTRAL=mistralai/Mixtral-8x7B-Instruct-v0.1
Q235=Qwen/Qwen3-235B-A22B
DSV2=deepseek-ai/DeepSeek-V2-Lite
OLMOE=allenai/OLMoE-1B-7B-0924
KNOWN="qwen15-modular qwen15-live mixtral-modular mixtral-live q235-modular dsv2-modular"
KNOWN="$KNOWN olmoe-modular olmoe-live qwen15 mixtral more all"
parts=()
for arg in "$@"; do
  case $arg in
    all) parts+=(qwen15-modular qwen15-live mixtral-modular mixtral-live) ;;
    qwen15) parts+=(qwen15-modular qwen15-live) ;;
    mixtral) parts+=(mixtral-modular mixtral-live) ;;
    more) parts+=(q235-modular dsv2-modular olmoe-modular olmoe-live) ;;
    qwen15-modular | qwen15-live | mixtral-modular | mixtral-live | q235-modular | \
      dsv2-modular | olmoe-modular | olmoe-live) parts+=("$arg") ;;
    *) log "unknown part $arg ($KNOWN)" ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || { log "nothing to run"; exit 2; }

nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv >>"$OUT_DIR/models.log" 2>&1
python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)" \
  >>"$OUT_DIR/models.log" 2>&1
for p in "${parts[@]}"; do
  case $p in
    qwen15-modular) part "$p" "$QWEN15" vllm-modular 1,2 "${QWEN15_MODULAR_S:-330}" ;;
    qwen15-live) part "$p" "$QWEN15" vllm-live 1 "${QWEN15_LIVE_S:-150}" ;;
    mixtral-modular) part "$p" "$MIXTRAL" vllm-modular 1,2 "${MIXTRAL_MODULAR_S:-310}" ;;
    mixtral-live) part "$p" "$MIXTRAL" vllm-live 1 "${MIXTRAL_LIVE_S:-170}" ;;
    # The catalog's other models, TP1/DP1, with the default plan (kernel steps v4).
    q235-modular) part "$p" "$Q235" vllm-modular 1 "${Q235_MODULAR_S:-200}" auto ;;
    dsv2-modular) part "$p" "$DSV2" vllm-modular 1 "${DSV2_MODULAR_S:-150}" auto ;;
    # OLMoE's config names no dtype (acquisition/catalog/README.md): bf16, as it is served.
    olmoe-modular) part "$p" "$OLMOE" vllm-modular 1 "${OLMOE_MODULAR_S:-110}" auto \
      --dtype bfloat16 ;;
    olmoe-live) part "$p" "$OLMOE" vllm-live 1 "${OLMOE_LIVE_S:-120}" auto --dtype bfloat16 ;;
  esac
done
log "summary:"
tee -a "$OUT_DIR/models.log" <"$OUT_DIR/summary.txt"
