#!/usr/bin/env bash
# Issue 18's remaining GPU parts on ONE H200, one device call of about 2-3 min (limits add up to
# 240 s; docs/h200-runs.md, "Issue 18's remaining GPU parts: prepared"). Parts, in this order,
# each under its own timeout, the archive repacked after every part:
#
#   fp8-spread   scripts/h200_load_spread.py --dtype fp8 --deployments tp1: the load-spread arms
#                (balanced, 4 draws each of uniform, power_law(0.6), power_law(1.2)) on the
#                Qwen3-30B-A3B-Instruct-2507-FP8 DP1 kernel (block FP8, TritonExperts, vLLM's
#                tuned H200 FP8 config: 16-row blocks up to 128 rows, 64 from 200), under
#                VLLM_USE_DEEP_GEMM=0 as the shipped FP8 tables; N in FP8_TOKENS (78 records).
#                ~40 s                                   limit FP8_SPREAD_S=80
#   tp1-native   the TP1 engine validation with the engine's own router (dummy weights):
#                DP=1 REPS=3 scripts/h200x2_estimate_run.sh native (25 steps, N 1..2,048), as
#                docs/evidence/h200-tp1-validation's simulator and normal_routing parts were run.
#                ~25-60 s                                limit NATIVE_S=120
#   bf16-small   scripts/h200_load_spread.py --deployments tp1 at N in SMALL_TOKENS: the bf16
#                TP1 kernel's 16/32/64-row blocks (the shipped run has only N = 256 below 128-row
#                blocks), 78 records. ~25 s             limit BF16_SMALL_S=40
#   all          the three (default; session 5's call 7)
#
# Session 11's parts (the deployments the shipped runs left without a tile model; "ranks" runs
# the four). Each times the same arms (balanced + 4 draws each of uniform, power_law(0.6),
# power_law(1.2)) at EP rank 0 of its deployment:
#   fp8-ep2      --dtype fp8 --deployments ep2 at N in FP8_EP2_TOKENS: the FP8 DP2/EP2 ranks'
#                kernel (64 local experts), VLLM_USE_DEEP_GEMM=0. limit FP8_EP2_S=90
#   ep2-small    --deployments ep2 at N in EP2_SMALL_TOKENS: the bf16 DP2/EP2 ranks' 16/32/64-row
#                blocks (the session-4 run has one N below 128-row blocks). limit EP2_SMALL_S=60
#   ep4          --deployments ep4 at N in EP4_TOKENS: the DP4/EP4 ranks (32 local experts).
#                limit EP4_S=90
#   ep8          --deployments ep8 at N in EP8_TOKENS: the DP8/EP8 ranks (16 local experts).
#                limit EP8_S=90
#
# Run on the GPU machine with the kit staged and env.sh sourced, from the repository root:
#   bash scripts/h200_spread_rest.sh [PART...]
# Environment: ROOT (default /tmp/spread-rest; the parts write there), OUT, the limits,
# FP8_TOKENS, SMALL_TOKENS, FP8_EP2_TOKENS, EP2_SMALL_TOKENS, EP4_TOKENS, EP8_TOKENS. $OUT receives spread-rest.log (commands, exits, walls), summary.txt
# (one line a part) and spread-rest.tar.gz (repacked after each part): load_spread_fp8.json,
# load_spread_bf16_small.json, load_spread_fp8_ep2.json, load_spread_bf16_{ep2_small,ep4,ep8}.json
# and their logs, tp1-native/ (validation/native/rank0.json,
# validation_native.log, gpus.csv, topo.txt), gpus.csv and spread-rest.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-var/spread-rest-out}
ROOT=${ROOT:-/tmp/spread-rest}
FP8_TOKENS=${FP8_TOKENS:-128,256,512,1024,1536,2048}
SMALL_TOKENS=${SMALL_TOKENS:-64,128,200,384,512,640}
FP8_EP2_TOKENS=${FP8_EP2_TOKENS:-64,128,256,512,1024,2048,3072,4096}
EP2_SMALL_TOKENS=${EP2_SMALL_TOKENS:-24,64,96,128,200,384,512}
EP4_TOKENS=${EP4_TOKENS:-64,256,512,1024,2048,4096,6144,8192}
EP8_TOKENS=${EP8_TOKENS:-128,512,1024,2048,4096,8192,12288,16384}
mkdir -p "$OUT_DIR" "$ROOT"
export PYTHONUNBUFFERED=1
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT_DIR/spread-rest.log"; }

pack() { # everything under $ROOT, as one archive (top level spread-rest/)
  cp "$OUT_DIR/spread-rest.log" "$ROOT/spread-rest.log" 2>/dev/null
  tar -czf "$OUT_DIR/spread-rest.tar.gz" -C "$(dirname "$ROOT")" --exclude=triton \
    "$(basename "$ROOT")" && log "packed spread-rest.tar.gz ($(du -h "$OUT_DIR/spread-rest.tar.gz" | cut -f1))"
}

finish() { # PART STATUS START
  local line="$1: exit $2 after $(($(date +%s) - $3))s"
  log "$line"
  echo "$line" >>"$OUT_DIR/summary.txt"
  pack
}

nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,clocks.max.sm --format=csv \
  >"$ROOT/gpus.csv" 2>&1 || true
log "versions: $(python3 -c 'import torch, vllm; print(torch.__version__, vllm.__version__)' 2>&1 | tail -n 1)"

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(all)
[ "${parts[*]}" = all ] && parts=(fp8-spread tp1-native bf16-small)
[ "${parts[*]}" = ranks ] && parts=(fp8-ep2 ep2-small ep4 ep8)
for part in "${parts[@]}"; do
  t0=$(date +%s)
  case $part in
    fp8-spread)
      cmd=(python3 scripts/h200_load_spread.py "$ROOT/load_spread_fp8.json" --dtype fp8
        --deployments tp1 --tokens "$FP8_TOKENS")
      log "fp8-spread: VLLM_USE_DEEP_GEMM=0 timeout ${FP8_SPREAD_S:-80} ${cmd[*]}"
      VLLM_USE_DEEP_GEMM=0 timeout "${FP8_SPREAD_S:-80}" "${cmd[@]}" >"$ROOT/load_spread_fp8.log" 2>&1
      finish fp8-spread $? "$t0" ;;
    tp1-native)
      log "tp1-native: DP=1 REPS=3 VAL_TIMEOUT=${NATIVE_S:-120} bash scripts/h200x2_estimate_run.sh native"
      OUT="$ROOT/tp1-native" DP=1 REPS=3 VAL_TIMEOUT="${NATIVE_S:-120}" \
        bash scripts/h200x2_estimate_run.sh native >"$ROOT/tp1-native.log" 2>&1
      status=$?
      # the run script reports the validation's own exit code in its log
      log "tp1-native: $(grep -E '^native: rc=' "$ROOT/tp1-native.log" | tail -n 1)"
      finish tp1-native "$status" "$t0" ;;
    bf16-small)
      cmd=(python3 scripts/h200_load_spread.py "$ROOT/load_spread_bf16_small.json"
        --deployments tp1 --tokens "$SMALL_TOKENS")
      log "bf16-small: timeout ${BF16_SMALL_S:-40} ${cmd[*]}"
      timeout "${BF16_SMALL_S:-40}" "${cmd[@]}" >"$ROOT/load_spread_bf16_small.log" 2>&1
      finish bf16-small $? "$t0" ;;
    fp8-ep2)
      cmd=(python3 scripts/h200_load_spread.py "$ROOT/load_spread_fp8_ep2.json" --dtype fp8
        --deployments ep2 --tokens "$FP8_EP2_TOKENS")
      log "fp8-ep2: VLLM_USE_DEEP_GEMM=0 timeout ${FP8_EP2_S:-90} ${cmd[*]}"
      VLLM_USE_DEEP_GEMM=0 timeout "${FP8_EP2_S:-90}" "${cmd[@]}" >"$ROOT/load_spread_fp8_ep2.log" 2>&1
      finish fp8-ep2 $? "$t0" ;;
    ep2-small | ep4 | ep8)
      case $part in
        ep2-small) dep=ep2 tokens=$EP2_SMALL_TOKENS limit=${EP2_SMALL_S:-60} ;;
        ep4) dep=ep4 tokens=$EP4_TOKENS limit=${EP4_S:-90} ;;
        ep8) dep=ep8 tokens=$EP8_TOKENS limit=${EP8_S:-90} ;;
      esac
      name=load_spread_bf16_${part//-/_}
      cmd=(python3 scripts/h200_load_spread.py "$ROOT/$name.json" --deployments "$dep"
        --tokens "$tokens")
      log "$part: timeout $limit ${cmd[*]}"
      timeout "$limit" "${cmd[@]}" >"$ROOT/$name.log" 2>&1
      finish "$part" $? "$t0" ;;
    *) log "unknown part $part" ;;
  esac
done
