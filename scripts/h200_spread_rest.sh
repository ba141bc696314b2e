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
# Session 13's parts (the catalog models of session 12, whose tables carry no tile model yet;
# "models" runs the seven). The same arms at each model's own geometry (`--model`), N covering
# vLLM's 32-, 64- and 128-row blocks (default config: 64 rows from N = 97, 128 from 513) up to
# the tables' largest N (2,048 per DP rank, gathered):
#   q235-tp1     Qwen/Qwen3-235B-A22B tp1 (128 experts, width 1536) at DP1_TOKENS. limit Q235_TP1_S=120
#   q235-ep4     its DP4/EP4 rank 0 (32 local) at EP4_MODEL_TOKENS. limit Q235_EP4_S=90
#   q235-ep8     its DP8/EP8 rank 0 (16 local) at EP8_MODEL_TOKENS. limit Q235_EP8_S=90
#   olmoe-tp1    allenai/OLMoE-1B-7B-0924 tp1 (64 experts, width 1024) at DP1_TOKENS. limit OLMOE_TP1_S=80
#   olmoe-ep2    its DP2/EP2 rank 0 (32 local) at EP2_MODEL_TOKENS. limit OLMOE_EP2_S=70
#   dsv2-tp1     deepseek-ai/DeepSeek-V2-Lite tp1 (64 routed experts, top-6, width 1408): the
#                routed experts' kernel, the loads given as ids (the grouped router is not in
#                it). At DP1_TOKENS. limit DSV2_TP1_S=80
#   dsv2-ep2     its DP2/EP2 rank 0 (32 local) at EP2_MODEL_TOKENS. limit DSV2_EP2_S=70
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
DP1_TOKENS=${DP1_TOKENS:-64,96,128,256,384,512,640,1024,1536,2048}
EP2_MODEL_TOKENS=${EP2_MODEL_TOKENS:-64,128,256,512,1024,2048,3072,4096}
EP4_MODEL_TOKENS=${EP4_MODEL_TOKENS:-128,256,512,1024,2048,4096,8192}
EP8_MODEL_TOKENS=${EP8_MODEL_TOKENS:-256,512,1024,2048,4096,8192,16384}
Q235=Qwen/Qwen3-235B-A22B OLMOE=allenai/OLMoE-1B-7B-0924 DSV2=deepseek-ai/DeepSeek-V2-Lite
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

spread() { # PART NAME LIMIT DEPLOYMENT TOKENS [fp8|-] [MODEL]: one load-spread run under its timeout
  local part=$1 name=$2 limit=$3 cmd=(python3 scripts/h200_load_spread.py "$ROOT/$2.json")
  [ "${6:-}" = fp8 ] && cmd+=(--dtype fp8)
  [ -n "${7:-}" ] && cmd+=(--model "$7")
  cmd+=(--deployments "$4" --tokens "$5")
  if [ "${6:-}" = fp8 ]; then # FP8 as the shipped FP8 tables were measured: DeepGEMM off
    log "$part: VLLM_USE_DEEP_GEMM=0 timeout $limit ${cmd[*]}"
    VLLM_USE_DEEP_GEMM=0 timeout "$limit" "${cmd[@]}" >"$ROOT/$name.log" 2>&1
  else
    log "$part: timeout $limit ${cmd[*]}"
    timeout "$limit" "${cmd[@]}" >"$ROOT/$name.log" 2>&1
  fi
  finish "$part" $? "$t0"
}

nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,clocks.max.sm --format=csv \
  >"$ROOT/gpus.csv" 2>&1 || true
log "versions: $(python3 -c 'import torch, vllm; print(torch.__version__, vllm.__version__)' 2>&1 | tail -n 1)"

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(all)
[ "${parts[*]}" = all ] && parts=(fp8-spread tp1-native bf16-small)
[ "${parts[*]}" = ranks ] && parts=(fp8-ep2 ep2-small ep4 ep8)
[ "${parts[*]}" = models ] && parts=(olmoe-tp1 olmoe-ep2 dsv2-tp1 dsv2-ep2 q235-tp1 q235-ep4 q235-ep8)
for part in "${parts[@]}"; do
  t0=$(date +%s)
  case $part in
    fp8-spread) spread fp8-spread load_spread_fp8 "${FP8_SPREAD_S:-80}" tp1 "$FP8_TOKENS" fp8 ;;
    tp1-native)
      log "tp1-native: DP=1 REPS=3 VAL_TIMEOUT=${NATIVE_S:-120} bash scripts/h200x2_estimate_run.sh native"
      OUT="$ROOT/tp1-native" DP=1 REPS=3 VAL_TIMEOUT="${NATIVE_S:-120}" \
        bash scripts/h200x2_estimate_run.sh native >"$ROOT/tp1-native.log" 2>&1
      status=$?
      # the run script reports the validation's own exit code in its log
      log "tp1-native: $(grep -E '^native: rc=' "$ROOT/tp1-native.log" | tail -n 1)"
      finish tp1-native "$status" "$t0" ;;
    bf16-small) spread bf16-small load_spread_bf16_small "${BF16_SMALL_S:-40}" tp1 "$SMALL_TOKENS" ;;
    fp8-ep2) spread fp8-ep2 load_spread_fp8_ep2 "${FP8_EP2_S:-90}" ep2 "$FP8_EP2_TOKENS" fp8 ;;
    ep2-small) spread ep2-small load_spread_bf16_ep2_small "${EP2_SMALL_S:-60}" ep2 "$EP2_SMALL_TOKENS" ;;
    ep4) spread ep4 load_spread_bf16_ep4 "${EP4_S:-90}" ep4 "$EP4_TOKENS" ;;
    ep8) spread ep8 load_spread_bf16_ep8 "${EP8_S:-90}" ep8 "$EP8_TOKENS" ;;
    q235-tp1) spread q235-tp1 load_spread_q235_tp1 "${Q235_TP1_S:-120}" tp1 "$DP1_TOKENS" - "$Q235" ;;
    q235-ep4) spread q235-ep4 load_spread_q235_ep4 "${Q235_EP4_S:-90}" ep4 "$EP4_MODEL_TOKENS" - "$Q235" ;;
    q235-ep8) spread q235-ep8 load_spread_q235_ep8 "${Q235_EP8_S:-90}" ep8 "$EP8_MODEL_TOKENS" - "$Q235" ;;
    olmoe-tp1) spread olmoe-tp1 load_spread_olmoe_tp1 "${OLMOE_TP1_S:-80}" tp1 "$DP1_TOKENS" - "$OLMOE" ;;
    olmoe-ep2) spread olmoe-ep2 load_spread_olmoe_ep2 "${OLMOE_EP2_S:-70}" ep2 "$EP2_MODEL_TOKENS" - "$OLMOE" ;;
    dsv2-tp1) spread dsv2-tp1 load_spread_dsv2_tp1 "${DSV2_TP1_S:-80}" tp1 "$DP1_TOKENS" - "$DSV2" ;;
    dsv2-ep2) spread dsv2-ep2 load_spread_dsv2_ep2 "${DSV2_EP2_S:-70}" ep2 "$EP2_MODEL_TOKENS" - "$DSV2" ;;
    *) log "unknown part $part" ;;
  esac
done
