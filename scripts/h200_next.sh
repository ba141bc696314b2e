#!/usr/bin/env bash
# The next session's first device burst on ONE H200 (prepared 2026-12-01, session 4;
# docs/h200-runs.md "Session 5's first burst: as prepared in session 4"). Parts, selectable, each under its own
# timeout (SIGTERM, samples kept: the same part resumes), results packed after every part:
#
#   qwen3-modular  Qwen3-30B-A3B bf16, vllm-modular, factor 2 WITH the kernel-step rule v2
#                  (--moe-kernel-steps v2: the plan of bundles/H200-vllm-modular-f2k, which
#                  session 5 measured as `on` when on meant v2; `on`/`auto` now plan v4),
#                  TP1/DP1 then TP1/DP2/EP2 ranks 0 and 1 (--dp 1,2):
#                  568 + 1,207 + 1,207 rows planned; also the modular tables' conservation
#                  traces (issue 14). ~5-7 min             limit QWEN3_MODULAR_S=560
#   qwen3-live     the same v2 plan through vllm-live TP1 (568 rows; bundles/H200-vllm-live-f2k).
#                  ~3-4 min
#                                                          limit QWEN3_LIVE_S=300
#   fp8-dp1        Qwen3-30B-A3B-FP8 vllm-modular TP1/DP1 alone under VLLM_USE_DEEP_GEMM=0,
#                  the shipped FP8 bundle's plan (kernel steps off), to replace its DP1 entry
#                  (scripts/h200_fp8.sh modular, MODULAR_DPS=1). ~1-1.5 min
#                                                          limit FP8_DP1_S=150
#   mixtral-rank1  Mixtral-8x7B vllm-modular DP2 rank 1 resumed from its checkpoint (the
#                  shipped plan, kernel steps off; scripts/h200_models.sh mixtral-modular).
#                  ~1 min                                  limit MIXTRAL_RANK1_S=90
#   v3-modular-dp1 Qwen3-30B-A3B bf16, vllm-modular TP1/DP1 alone, factor 2 with kernel-step rule
#                  v3 (--moe-kernel-steps v3: v2 plus both edges of every padding ramp; issue 20
#                  item 1): 633 rows. ~1.5-2 min                limit V3_MODULAR_S=200
#   v3-live        the same v3 plan through vllm-live TP1 (633 rows). ~1.5-2.5 min
#                                                          limit V3_LIVE_S=240
#   v4-modular-dp1 the same with kernel-step rule v4 (--moe-kernel-steps v4: v3 plus the A values
#                  where the tiles bend along A at EP1's 16-row rows): 1,010 rows. ~1.5-2 min
#                                                          limit V4_MODULAR_S=200
#   v4-live        the same v4 plan through vllm-live TP1 (1,010 rows). ~1.5-2 min
#                                                          limit V4_LIVE_S=220
#   all            the first four in this order (~11-14 min: two calls; see below)
#
# Run on the GPU machine with the kit staged and env.sh sourced, from the repository root:
#   bash scripts/h200_next.sh PART...
# One device call holds at most 600 s: `qwen3-modular` alone in one call; `qwen3-live fp8-dp1
# mixtral-rank1` (300 + 150 + 90 s of limits) in the next.
#
# Environment: ROOT (default /tmp/next; part P writes $ROOT/P/), RESUME_FROM (space-separated
# tarballs of earlier calls' $OUT/<part>.tar.gz, unpacked into $ROOT first: a part that timed out
# continues from its checkpoint on a fresh machine), MIXTRAL_FROM (the state mixtral-rank1
# resumes: call 12's models-runs.tar.gz, whose top level is mixtral-modular/, or the shipped
# bundle's bf16.acquisition-samples.tar.gz, whose top level is out/; carried into the working
# tree as an ignored path; not needed when $ROOT/mixtral-rank1 already holds it), the limits,
# EXTRA_ARGS (appended to the Qwen3 parts' acquisitions).
# $OUT receives next.log (commands, exits, walls, published deployments per part), summary.txt
# (one line a part) and <part>.tar.gz per part, repacked after the part (run.log,
# progress.jsonl, phases.jsonl, the bundle under out/H200/... and the _acquisition checkpoint;
# no writer locks, no compiler caches), so a call stopped between parts returns what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-var/next-out}
ROOT=${ROOT:-/tmp/next}
CAPTURES=1,2,4,8,16,32,64,128,256
QWEN3=Qwen/Qwen3-30B-A3B-Instruct-2507
mkdir -p "$OUT_DIR" "$ROOT"
export PYTHONUNBUFFERED=1
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT_DIR/next.log"; }

for tarball in ${RESUME_FROM:-}; do
  if tar -xzf "$tarball" -C "$ROOT"; then log "resumed state from $tarball"
  else log "could not unpack $tarball"; fi
done

pack() { # PART: its state as $OUT/PART.tar.gz (top level PART/, as RESUME_FROM unpacks it)
  tar -czf "$OUT_DIR/$1.tar.gz" -C "$ROOT" --exclude=writer.lock --exclude=triton \
    --exclude=vllm-cache --exclude=runs.tar.gz "$1" && log "packed $1.tar.gz ($(du -h "$OUT_DIR/$1.tar.gz" | cut -f1))"
}

published() { # the deployments under a directory's bundles (one components.csv each)
  find "$1" -path '*/out/H200/*' -name components.csv 2>/dev/null |
    sed -E 's#.*/(tp[0-9]+/moe_components/[^/]+)/components.csv#\1#' | sort | tr '\n' ' '
}

finish() { # PART STATUS START LOGFILE
  local line="$1: exit $2 after $(($(date +%s) - $3))s; published: $(published "$ROOT/$1")"
  log "$line"
  [ -f "$4" ] && log "$1: $(tail -n 1 "$4" | cut -c1-240)"
  echo "$line" >>"$OUT_DIR/summary.txt"
  pack "$1"
}

qwen3() { # PART BACKEND DPS LIMIT_S [RULE]: the factor-2 plan with the kernel-step rule
  # RULE defaults to v2, named rather than `on`: the qwen3-* parts reproduce the f2k tables,
  # and `on` follows the acquisition's default rule (v4 since session 6).
  local label=$1 backend=$2 dps=$3 limit=$4 steps=${5:-v2}
  local run=$ROOT/$label
  mkdir -p "$run"
  local extra=()
  # The kit has no flash-attention: the live component engine runs Triton attention.
  [ "$backend" = vllm-live ] && extra=(--engine-attention-backend TRITON_ATTN)
  # EXTRA_ARGS (optional): appended to the Qwen3 parts' command lines, e.g.
  # "--triton-precompile-workers 1" (serial Triton precompilation).
  local more=()
  read -r -a more <<<"${EXTRA_ARGS:-}"
  extra+=("${more[@]}")
  local cmd=(python3 -m acquisition slice "$QWEN3" --hardware H200 --tp 1 --tp-refresh 1
    --group moe --max-num-batched-tokens 2048 --max-num-seqs 128 --moe-rounds 3
    --measurement-iterations 3 --moe-grid-factor 2 --moe-kernel-steps "$steps"
    --cudagraph-capture-sizes "$CAPTURES" --no-progress-bar --dp "$dps" --backend "$backend"
    --out-root "$run/out" --progress-json "$run/progress.jsonl" --phase-log "$run/phases.jsonl"
    "${extra[@]}")
  log "$label: timeout $limit ${cmd[*]}"
  local start
  start=$(date +%s)
  TRITON_CACHE_DIR="$ROOT/triton" VLLM_CACHE_ROOT="$ROOT/vllm-cache" \
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
    timeout --signal=TERM --kill-after=20 "$limit" "${cmd[@]}" >>"$run/run.log" 2>&1
  finish "$label" $? "$start" "$run/run.log"
}

fp8_dp1() { # the shipped FP8 plan (kernel steps off), DP1 alone, DeepGEMM off
  local run=$ROOT/fp8-dp1 start
  mkdir -p "$run"
  log "fp8-dp1: VLLM_USE_DEEP_GEMM=0 KERNEL_STEPS=off MODULAR_DPS=1 MODULAR_S=${FP8_DP1_S:-150} scripts/h200_fp8.sh modular"
  start=$(date +%s)
  VLLM_USE_DEEP_GEMM=0 KERNEL_STEPS=off ROOT="$run" OUT="$run/logs" MODULAR_DPS=1 \
    MODULAR_S="${FP8_DP1_S:-150}" bash scripts/h200_fp8.sh modular >>"$run/script.log" 2>&1
  finish fp8-dp1 $? "$start" "$run/logs/modular.log"
}

mixtral_rank1() { # resume call 12's checkpoint: the shipped plan, kernel steps off
  local run=$ROOT/mixtral-rank1 start
  mkdir -p "$run"
  if [ -n "${MIXTRAL_FROM:-}" ] && [ ! -d "$run/mixtral-modular/out/_acquisition" ]; then
    # (the listing first: under pipefail, grep -q closing the pipe early would fail tar)
    local listing
    listing=$(tar -tzf "$MIXTRAL_FROM")
    if grep -q '^\(\./\)\?mixtral-modular/' <<<"$listing"; then
      tar -xzf "$MIXTRAL_FROM" -C "$run" --wildcards '*mixtral-modular/*'
    else # a bundle's samples archive: out/_acquisition and the logs of the modular part
      mkdir -p "$run/mixtral-modular" && tar -xzf "$MIXTRAL_FROM" -C "$run/mixtral-modular"
    fi
    log "mixtral-rank1: state from $MIXTRAL_FROM"
  fi
  [ -d "$run/mixtral-modular/out/_acquisition" ] ||
    log "mixtral-rank1: no checkpoint under $run (MIXTRAL_FROM unset?): it starts from scratch"
  log "mixtral-rank1: KERNEL_STEPS=off MIXTRAL_MODULAR_S=${MIXTRAL_RANK1_S:-90} scripts/h200_models.sh mixtral-modular"
  start=$(date +%s)
  KERNEL_STEPS=off ROOT="$run" OUT="$run/logs" MIXTRAL_MODULAR_S="${MIXTRAL_RANK1_S:-90}" \
    bash scripts/h200_models.sh mixtral-modular >>"$run/script.log" 2>&1
  finish mixtral-rank1 $? "$start" "$run/mixtral-modular/run.log"
}

parts=()
for arg in "$@"; do
  case $arg in
    all) parts+=(qwen3-modular qwen3-live fp8-dp1 mixtral-rank1) ;;
    qwen3-modular | qwen3-live | fp8-dp1 | mixtral-rank1 | v3-modular-dp1 | v3-live | \
      v4-modular-dp1 | v4-live)
      parts+=("$arg") ;;
    *) log "unknown part $arg (qwen3-modular qwen3-live fp8-dp1 mixtral-rank1 v3-modular-dp1 v3-live v4-modular-dp1 v4-live all)" ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || { log "nothing to run"; exit 2; }

nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv >>"$OUT_DIR/next.log" 2>&1
python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)" \
  >>"$OUT_DIR/next.log" 2>&1
for p in "${parts[@]}"; do
  case $p in
    qwen3-modular) qwen3 "$p" vllm-modular 1,2 "${QWEN3_MODULAR_S:-560}" ;;
    qwen3-live) qwen3 "$p" vllm-live 1 "${QWEN3_LIVE_S:-300}" ;;
    v3-modular-dp1) qwen3 "$p" vllm-modular 1 "${V3_MODULAR_S:-200}" v3 ;;
    v3-live) qwen3 "$p" vllm-live 1 "${V3_LIVE_S:-240}" v3 ;;
    v4-modular-dp1) qwen3 "$p" vllm-modular 1 "${V4_MODULAR_S:-200}" v4 ;;
    v4-live) qwen3 "$p" vllm-live 1 "${V4_LIVE_S:-220}" v4 ;;
    fp8-dp1) fp8_dp1 ;;
    mixtral-rank1) mixtral_rank1 ;;
  esac
done
log "summary:"
tee -a "$OUT_DIR/next.log" <"$OUT_DIR/summary.txt"
