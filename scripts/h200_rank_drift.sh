#!/usr/bin/env bash
# Rank drift in one acquisition process vs target isolation (PREPARED, NOT RUN yet; see
# docs/h200-runs.md "Rank drift: one process vs isolated targets").
#
# The wide-EP DP8 bundle measured its ranks in turn in one process; rank 7 came out +18.7 %
# above rank 0 at N <= 64 (identical local geometry), rank 1 already +7.8 %, while rank 7's
# points re-measured by a fresh process sat +2.8 % above. This measures TP1/DP8/EP8 ranks 0 and 7
# of the same Qwen3-30B-A3B slice (factor 4, as the shipped bundle) twice:
#   one-process: --ranks 0,7 --isolate-targets off  (rank 7 right after rank 0, same process;
#                the release between targets of acquisition/acquire.py is active)
#   isolated:    --ranks 0,7 --isolate-targets on   (each rank in a fresh child process)
# and, with REVERSED=1, a third run in two fresh processes, rank 7 first, then rank 0 (the rank
# filter adds rank 0 into the same bundle): does a difference follow the rank or the order?
# GPU clocks, temperature, power and throttle reasons are sampled every 500 ms meanwhile.
#
# Run on the GPU machine with the kit staged and env.sh sourced, from the device copy's root:
#   bash scripts/h200_rank_drift.sh
# Environment: ROOT (default /tmp/drift), LIMIT_S per run (default 240), RUNS (default
# "one-process isolated"; the order the runs are made in), REVERSED=1 (adds the third run).
# $OUT receives drift.log, clocks.csv, drift.json / drift.md (bench/rank_drift.py, when the
# device's Python can import moetables) and runs.tar.gz (per run: phases.jsonl,
# progress.jsonl, run.log, the bundle and the _acquisition checkpoint without writer locks).
set -uo pipefail
OUT_DIR=${OUT:-var/drift-out}
ROOT=${ROOT:-/tmp/drift}
LIMIT_S=${LIMIT_S:-240}
RUNS=${RUNS:-one-process isolated}
mkdir -p "$OUT_DIR" "$ROOT"
export PYTHONUNBUFFERED=1
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT_DIR/drift.log"; }
BUNDLE_TAIL=out/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active \
  --format=csv -lms 500 >"$OUT_DIR/clocks.csv" 2>&1 &
SAMPLER=$!

acquire() { # LABEL EXTRA_ARGS...: one command into $ROOT/LABEL, stopped after LIMIT_S
  local label=$1
  shift
  local run=$ROOT/$label
  mkdir -p "$run"
  local cmd=(python3 -m acquisition slice Qwen/Qwen3-30B-A3B-Instruct-2507
    --hardware H200 --tp 1 --tp-refresh 1 --group moe --max-num-batched-tokens 2048
    --max-num-seqs 128 --moe-rounds 3 --measurement-iterations 3 --moe-grid-factor 4
    --cudagraph-capture-sizes 1,2,4,8,16,32,64,128,256 --no-progress-bar --dp 8
    --backend vllm-modular --out-root "$run/out" --progress-json "$run/progress.jsonl"
    --phase-log "$run/phases.jsonl" "$@")
  log "$label: timeout $LIMIT_S ${cmd[*]}"
  local start
  start=$(date +%s)
  TRITON_CACHE_DIR="$ROOT/triton" VLLM_CACHE_ROOT="$ROOT/vllm-cache" \
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
    timeout --signal=TERM --kill-after=20 "$LIMIT_S" "${cmd[@]}" >>"$run/run.log" 2>&1
  local status=$?
  log "$label: exit $status after $(($(date +%s) - start))s; $(tail -n 1 "$run/run.log" | cut -c1-200)"
}

specs=()
for label in $RUNS; do
  case $label in
    one-process) acquire one-process --ranks 0,7 --isolate-targets off ;;
    isolated) acquire isolated --ranks 0,7 --isolate-targets on ;;
    *) log "unknown run $label (one-process, isolated)"; continue ;;
  esac
  specs+=(--run "$label=$ROOT/$label/$BUNDLE_TAIL")
done
if [ "${REVERSED:-0}" = 1 ]; then
  acquire reversed --ranks 7 --isolate-targets off
  acquire reversed --ranks 0 --isolate-targets off
  specs+=(--run "reversed=$ROOT/reversed/$BUNDLE_TAIL")
fi
kill "$SAMPLER" 2>/dev/null
wait "$SAMPLER" 2>/dev/null

nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv >>"$OUT_DIR/drift.log" 2>&1
python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)" \
  >>"$OUT_DIR/drift.log" 2>&1
# The comparison needs only moetables; it is repeated off the device from runs.tar.gz anyway.
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 bench/rank_drift.py --dp 8 --ranks 0,7 \
  "${specs[@]}" --json "$OUT_DIR/drift.json" >"$OUT_DIR/drift.md" 2>>"$OUT_DIR/drift.log" ||
  log "bench/rank_drift.py failed here (see drift.log); rerun it on the unpacked runs.tar.gz"
tar -czf "$OUT_DIR/runs.tar.gz" -C "$ROOT" --exclude=writer.lock --exclude=triton \
  --exclude=vllm-cache .
log "packed $(du -h "$OUT_DIR/runs.tar.gz" | cut -f1)"
