#!/usr/bin/env bash
# Issue 19's before/after pair and issue 20 item 6's repeatability, on ONE H200 (prepared
# 2026-12-01, session 5; docs/h200-runs.md "Before/after and repeatability: prepared").
#
# Parts, selectable, each acquisition under its own `timeout` (SIGTERM, samples kept), results
# packed as $OUT/<part>.tar.gz right after the part:
#
#   prepare      (CPU side, not on the device) the "before" code as a carried path:
#                `git archive $BEFORE acquisition moetables` (all a run imports) into
#                $ACQ_BEFORE (default var/carry/acq-before, ~1.0 MB; BEFORE default 8082367,
#                the code the fourth session's first burst ran, before the issue-19 second pass)
#   ab-modular   Qwen3-30B-A3B bf16 vllm-modular, factor 2, the "after" (this tree) then the
#                "before" ($ACQ_BEFORE), each from empty Triton/vLLM caches, on the targets
#                --dp $AB_DPS --ranks $AB_RANKS (default TP1/DP2/EP2 rank 0: 678 points), kernel
#                steps off in the after run (the before code has no such rule: the plans are
#                equal, and equal the shipped factor-2 plans). ~3.3 min  limit AB_MODULAR_S=150 a run
#   ab-live      the same pair through vllm-live TP1 (68 points). ~2 min  limit AB_LIVE_S=110 a run
#   host-cost    where the host time of one modular experts forward goes (issue 19 item 2):
#                bench/modular_host_cost.py on Qwen3-30B-A3B TP1/DP$HOST_COST_DP (default 1), 4 row
#                counts x 1,000 forwards per step; ~45 s  limit HOST_COST_S=120
#   repeat       Qwen1.5-MoE-A2.7B and Mixtral-8x7B-Instruct vllm-modular TP1/DP1 measured
#                again in new processes with the shipped plans (factor 2, kernel steps off), each
#                checked against its shipped table in bundles/H200-vllm-modular-f2 with
#                bench/acquisition_equivalence.py --check (median change <= 1 %, the same
#                weight sets, every point published). ~1.5 min  limit REPEAT_S=110 a model
#
# Run on the GPU machine with the kit staged and env.sh sourced, from the repository root:
#   bash scripts/h200_repeat.sh ab-modular repeat      # one call, ~5 min (BUDGET_S=560)
#   bash scripts/h200_repeat.sh ab-live host-cost      # second call, ~3 min
# BUDGET_S (default 560): wall seconds for the whole script; a run's limit is cut to what is
# left after RESERVE_S (default 25: checks and packing) and a run with less than MIN_RUN_S
# (default 40) left is skipped and logged. ROOT (default /tmp/repeat), ACQ_BEFORE, the limits,
# AB_DPS (default 2), AB_RANKS (default 0; empty: every rank), RESUME_FROM (space-separated
# <part>.tar.gz of an earlier call, unpacked into $ROOT first: a run stopped at its limit
# continues from its checkpoint on a fresh machine).
# $OUT receives repeat.log (commands, exits, walls, published deployments), summary.txt (one
# line a run), <part>.tar.gz per part (per run: run.log, progress.jsonl, phases.jsonl, the
# bundle under out/H200/... and the _acquisition checkpoint; no writer locks, no compiler
# caches), ab-summary.md (phase table of the pairs and their equivalence, against each other
# and the shipped factor-2 bundles), repeat-check.md (the two repeatability checks) and
# host-cost.md / host-cost.json (the host-cost table).
set -uo pipefail
cd "$(dirname "$0")/.."
SCRIPT_START=$(date +%s)
OUT_DIR=${OUT:-var/repeat-out}
ROOT=${ROOT:-/tmp/repeat}
ACQ_BEFORE=${ACQ_BEFORE:-var/carry/acq-before}
BEFORE=${BEFORE:-8082367}
BUDGET_S=${BUDGET_S:-560}
CAPTURES=1,2,4,8,16,32,64,128,256
QWEN3=Qwen/Qwen3-30B-A3B-Instruct-2507
SHIPPED=bundles/H200-vllm-modular-f2
mkdir -p "$OUT_DIR" "$ROOT"
export PYTHONUNBUFFERED=1
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT_DIR/repeat.log"; }

prepare() { # the before tree, on the CPU side (git is not on the device)
  rm -rf "$ACQ_BEFORE" && mkdir -p "$ACQ_BEFORE" &&
    git archive "$BEFORE" acquisition moetables | tar -x -C "$ACQ_BEFORE" &&
    log "prepare: $ACQ_BEFORE = git archive $BEFORE ($(du -sh "$ACQ_BEFORE" | cut -f1)); carry it"
}

pack() { # PART: $ROOT/PART as $OUT/PART.tar.gz (top level PART/)
  tar -czf "$OUT_DIR/$1.tar.gz" -C "$ROOT" --exclude=writer.lock --exclude=triton \
    --exclude=vllm-cache "$1" && log "packed $1.tar.gz ($(du -h "$OUT_DIR/$1.tar.gz" | cut -f1))"
}

published() { # the deployments under a run's bundle (one components.csv each)
  find "$1/out" -path '*/out/H200/*' -name components.csv 2>/dev/null |
    sed -E 's#.*/(tp[0-9]+/moe_components/[^/]+)/components.csv#\1#' | sort | tr '\n' ' '
}

limit_for() { # WANTED: the limit cut to the budget left, or nothing (skip)
  local left=$((BUDGET_S - ${RESERVE_S:-25} - ($(date +%s) - SCRIPT_START)))
  if [ "$left" -lt "${MIN_RUN_S:-40}" ]; then return 1; fi
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

# run DIR RUN LIMIT MODEL BACKEND DPS [EXTRA...]: one acquisition of the code in DIR into RUN,
# factor 2, the shipped slice's serving limits, its own Triton and vLLM caches (CACHE, default
# RUN: empty at the start of the run, as on a fresh machine).
run() {
  local dir=$1 run=$2 wanted=$3 model=$4 backend=$5 dps=$6
  shift 6
  local label=${run#"$ROOT"/} limit
  if ! limit=$(limit_for "$wanted"); then
    log "$label: skipped, not enough of the ${BUDGET_S}s budget left"
    echo "$label: skipped (budget)" >>"$OUT_DIR/summary.txt"
    return
  fi
  mkdir -p "$run"
  local cache=${CACHE:-$run}
  [ "$cache" = "$run" ] && rm -rf "$run/triton" "$run/vllm-cache"
  local extra=("$@")
  [ "$backend" = vllm-live ] && extra+=(--engine-attention-backend TRITON_ATTN)
  local cmd=(python3 -m acquisition slice "$model" --hardware H200 --tp 1 --tp-refresh 1
    --group moe --max-num-batched-tokens 2048 --max-num-seqs 128 --moe-rounds 3
    --measurement-iterations 3 --moe-grid-factor 2 --cudagraph-capture-sizes "$CAPTURES"
    --no-progress-bar --dp "$dps" --backend "$backend" --out-root "$run/out"
    --progress-json "$run/progress.jsonl" --phase-log "$run/phases.jsonl" "${extra[@]}")
  log "$label: (cd $dir && timeout $limit ${cmd[*]})"
  local start status
  start=$(date +%s)
  (cd "$dir" && TRITON_CACHE_DIR="$cache/triton" VLLM_CACHE_ROOT="$cache/vllm-cache" \
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
    timeout --signal=TERM --kill-after=20 "$limit" "${cmd[@]}") >>"$run/run.log" 2>&1
  status=$?
  local line="$label: exit $status after $(($(date +%s) - start))s; published: $(published "$run")"
  log "$line"
  log "$label: $(tail -n 1 "$run/run.log" | cut -c1-240)"
  echo "$line" >>"$OUT_DIR/summary.txt"
}

ab() { # PART BACKEND DPS LIMIT: after (this tree) then before ($ACQ_BEFORE)
  local part=$1 backend=$2 dps=$3 limit=$4 name=${1#ab-}
  local ranks=()
  [ -n "${AB_RANKS-0}" ] && [ "$backend" = vllm-modular ] && ranks=(--ranks "${AB_RANKS-0}")
  run . "$ROOT/$part/after-$name-f2" "$limit" "$QWEN3" "$backend" "$dps" "${ranks[@]}" \
    --moe-kernel-steps off --isolate-targets off
  if [ -d "$ACQ_BEFORE/acquisition" ]; then
    run "$ACQ_BEFORE" "$ROOT/$part/before-$name-f2" "$limit" "$QWEN3" "$backend" "$dps" \
      "${ranks[@]}" --isolate-targets off
  else
    log "$part: before skipped: $ACQ_BEFORE holds no project copy (run the prepare part here and carry it)"
    echo "$part/before-$name-f2: skipped (no $ACQ_BEFORE)" >>"$OUT_DIR/summary.txt"
  fi
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 60 python3 bench/acquisition_speed_summary.py \
    "$ROOT/$part" >>"$OUT_DIR/ab-summary.md" 2>&1
  log "$part: summary exit $? (ab-summary.md)"
  pack "$part"
}

repeat() { # Qwen1.5-MoE and Mixtral DP1 again, each checked against its shipped table
  local label model status
  for pair in qwen15-dp1=Qwen/Qwen1.5-MoE-A2.7B mixtral-dp1=mistralai/Mixtral-8x7B-Instruct-v0.1; do
    label=${pair%%=*} model=${pair#*=}
    CACHE="$ROOT/repeat" run . "$ROOT/repeat/$label" "${REPEAT_S:-110}" "$model" vllm-modular 1 \
      --moe-kernel-steps off
    if [ ! -d "$ROOT/repeat/$label/out" ]; then
      log "repeat/$label: no out-root, nothing to check"
      continue
    fi
    {
      echo "## $label: $model TP1/DP1 against $SHIPPED"
      echo
      PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 60 python3 bench/acquisition_equivalence.py \
        "$SHIPPED" "$ROOT/repeat/$label/out" --model "$model" --check 2>&1
      status=$?
      echo
      echo "check exit $status"
      echo
    } >>"$OUT_DIR/repeat-check.md"
    log "repeat/$label: check against $SHIPPED exit $status (0: agrees)"
    echo "repeat/$label: check exit $status" >>"$OUT_DIR/summary.txt"
  done
  pack repeat
}

host_cost() { # the steps of one experts forward, timed on the device (no acquisition)
  local limit status
  if ! limit=$(limit_for "${HOST_COST_S:-120}"); then
    log "host-cost: skipped, not enough of the ${BUDGET_S}s budget left"
    echo "host-cost: skipped (budget)" >>"$OUT_DIR/summary.txt"
    return
  fi
  log "host-cost: timeout $limit python3 bench/modular_host_cost.py --dp ${HOST_COST_DP:-1}"
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout --signal=TERM --kill-after=20 "$limit" \
    python3 bench/modular_host_cost.py --dp "${HOST_COST_DP:-1}" --json "$OUT_DIR/host-cost.json" \
    >"$OUT_DIR/host-cost.md" 2>&1
  status=$?
  log "host-cost: exit $status"
  echo "host-cost: exit $status" >>"$OUT_DIR/summary.txt"
}

parts=()
for arg in "$@"; do
  case $arg in
    prepare | ab-modular | ab-live | repeat | host-cost) parts+=("$arg") ;;
    *) log "unknown part $arg (prepare ab-modular ab-live repeat host-cost)" ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || { log "nothing to run"; exit 2; }
if [ "${parts[*]}" = prepare ]; then prepare; exit $?; fi
for tarball in ${RESUME_FROM:-}; do
  if tar -xzf "$tarball" -C "$ROOT"; then log "resumed state from $tarball"
  else log "could not unpack $tarball"; fi
done

nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv >>"$OUT_DIR/repeat.log" 2>&1
python3 -c "from importlib.metadata import version as v; print('torch', v('torch'), 'vllm', v('vllm'), 'triton', v('triton'))" \
  >>"$OUT_DIR/repeat.log" 2>&1
for p in "${parts[@]}"; do
  case $p in
    prepare) prepare ;;
    ab-modular) ab ab-modular vllm-modular "${AB_DPS:-2}" "${AB_MODULAR_S:-150}" ;;
    ab-live) ab ab-live vllm-live 1 "${AB_LIVE_S:-110}" ;;
    repeat) repeat ;;
    host-cost) host_cost ;;
  esac
done
log "summary:"
tee -a "$OUT_DIR/repeat.log" <"$OUT_DIR/summary.txt"
log "script wall $(($(date +%s) - SCRIPT_START))s"
