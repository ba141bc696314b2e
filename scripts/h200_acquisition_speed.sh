#!/usr/bin/env bash
# Issue 19 (and issue 20 item 1): acquisition runs on the H200, each with its phase log, for the
# before/after tables of docs/benchmarks.md and the equivalence check.
#
# Run on the GPU machine with the kit staged and env.sh sourced, from the device copy's root:
#   bash .dev/acq/scripts/h200_acquisition_speed.sh LABEL=DIR:BACKEND:FACTOR:DPS:LIMIT_S[:TP[:TARGET]] ...
# DIR is a copy of the project (the "before" and "after" commits side by side); each run is
# the Qwen3-30B-A3B-Instruct-2507 bf16 slice of docs/h200-runs.md (TP1, --dp DPS, 3 rounds x 3
# iterations, 2048 tokens, 128 sequences, capture sizes 1..256 in powers of two) with
# --moe-grid-factor FACTOR, stopped by SIGTERM after LIMIT_S seconds (samples kept: the same
# command resumes). Every run starts from empty Triton and vLLM caches (a lent machine starts
# empty, so compile time is part of a run). Set RESUME_FROM=TARBALL to unpack an earlier
# runs.tar.gz into the run root first (a resumed run continues its checkpoint).
# TP (optional, default 1) is the target's TP degree: TP=2 slices the TP2 tables (--tp 1,2
# --tp-refresh 2: whole experts over EP = TP x DPS, every rank on this one GPU; issue 20 item 3).
# TARGET (optional) restricts the run to one target (--only-target, e.g. tp1/dp2_ep2_rank1_sp0).
# PARALLEL=1 starts every run at once on the one GPU (each its own process, out root and caches)
# and waits for all: the experiment of targets measured side by side (issue 19, session 10).
# $OUT receives runs.tar.gz (per run: phases.jsonl, progress.jsonl, run.log, the bundle's
# runtime files and the _acquisition checkpoint without writer locks) and speed.log.
# BUDGET_S (optional): wall seconds for the whole script from its start; each run's limit is
# cut to what is left after RESERVE_S (packing, analysis; default 30), and a run with less than
# MIN_RUN_S (default 40) left is skipped and logged. SUMMARY=1 ends with
# bench/acquisition_speed_summary.py over the run root (phase table, equivalence against the
# shipped factor-2 bundles and between before/after pairs) into $OUT/summary.md. EXTRA_ARGS
# (optional) is appended to every run's command line, e.g. "--isolate-targets off".
# Kernel steps: the command line names no --moe-kernel-steps, so each run plans its DIR's default
# rule (auto: v4 since session 6; v2 before). A run meant to be equivalent to
# bundles/H200-vllm-modular-f2k or H200-vllm-live-f2k (the same plan, point for point, and a
# comparable wall) must say EXTRA_ARGS="--moe-kernel-steps v2" (a DIR older than rule v3 knows no
# `v2`: there `on` is v2); "--moe-kernel-steps off" keeps the kernel-step-free factor-2 plan of
# bundles/H200-vllm-modular-f2 and -tp2-f2.
set -uo pipefail
SCRIPT_START=$(date +%s)
OUT_DIR=${OUT:-var/speed-out}
ROOT=${ROOT:-/tmp/speed}
CAPTURES=${CAPTURES:-1,2,4,8,16,32,64,128,256}
mkdir -p "$OUT_DIR" "$ROOT"
started_runs=()
export PYTHONUNBUFFERED=1
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT_DIR/speed.log"; }
# Whether vLLM's modules have bytecode before the first run (without importing vLLM): without
# it the first process compiles every module it imports, which lands in `admission`.
python3 - <<'PY' 2>&1 | tee -a "$OUT_DIR/speed.log"
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("vllm")
root = pathlib.Path(spec.origin).parent if spec and spec.origin else None
if root is not None:
    tag = sys.implementation.cache_tag
    sources = sum(1 for _ in root.rglob("*.py"))
    compiled = sum(1 for _ in root.rglob(f"__pycache__/*.{tag}.pyc"))
    print(f"vllm at {root}: {sources} .py files, {compiled} {tag} .pyc files before the runs")
PY
if [ -n "${RESUME_FROM:-}" ]; then
  tar -xzf "$RESUME_FROM" -C "$ROOT" && log "resumed state from $RESUME_FROM"
fi
for spec in "$@"; do
  label=${spec%%=*}
  IFS=: read -r dir backend factor dps limit tp only <<<"${spec#*=}"
  tp=${tp:-1}
  if [ "$tp" = 1 ]; then tp_args=(--tp 1 --tp-refresh 1); else tp_args=(--tp "1,$tp" --tp-refresh "$tp"); fi
  run=$ROOT/$label
  if [ -n "${BUDGET_S:-}" ]; then
    left=$(( BUDGET_S - ${RESERVE_S:-30} - ($(date +%s) - SCRIPT_START) ))
    if [ "$left" -lt "${MIN_RUN_S:-40}" ]; then
      log "$label: skipped, ${left}s left of the ${BUDGET_S}s budget"
      continue
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  if [ ! -d "$dir/acquisition" ]; then
    log "$label: skipped, $dir holds no project copy"
    continue
  fi
  mkdir -p "$run"
  rm -rf "$run/triton" "$run/vllm-cache"
  extra=()
  [ "$backend" = vllm-live ] && extra=(--engine-attention-backend TRITON_ATTN)
  read -r -a more <<<"${EXTRA_ARGS:-}"
  extra+=("${more[@]}")
  [ -n "${only:-}" ] && extra+=(--only-target "$only")
  cmd=(python3 -m acquisition.adapters.vllm_cli slice Qwen/Qwen3-30B-A3B-Instruct-2507
    --hardware H200 "${tp_args[@]}" --group moe --max-num-batched-tokens 2048
    --max-num-seqs 128 --moe-rounds 3 --measurement-iterations 3 --moe-grid-factor "$factor"
    --cudagraph-capture-sizes "$CAPTURES" --no-progress-bar --dp "$dps" --backend "$backend"
    --out-root "$run/out" --progress-json "$run/progress.jsonl" --phase-log "$run/phases.jsonl"
    "${extra[@]}")
  log "$label: (cd $dir && timeout $limit ${cmd[*]})"
  start=$(date +%s)
  if [ "${PARALLEL:-0}" = 1 ]; then
    (cd "$dir" && TRITON_CACHE_DIR="$run/triton" VLLM_CACHE_ROOT="$run/vllm-cache" \
      PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
      timeout --signal=TERM --kill-after=20 "$limit" "${cmd[@]}"; echo $? >"$run/exit_status") \
      >>"$run/run.log" 2>&1 &
    started_runs+=("$label:$start")
    continue
  fi
  (cd "$dir" && TRITON_CACHE_DIR="$run/triton" VLLM_CACHE_ROOT="$run/vllm-cache" \
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
    timeout --signal=TERM --kill-after=20 "$limit" "${cmd[@]}") >>"$run/run.log" 2>&1
  status=$?
  log "$label: exit $status after $(( $(date +%s) - start ))s; $(tail -n 1 "$run/run.log" | cut -c1-200)"
done
if [ "${PARALLEL:-0}" = 1 ]; then
  wait
  for entry in "${started_runs[@]}"; do
    label=${entry%%:*}
    log "$label: exit $(cat "$ROOT/$label/exit_status" 2>/dev/null || echo '?'), ended at \
$(date -u -r "$ROOT/$label/exit_status" +%H:%M:%S 2>/dev/null), started $(date -u -d "@${entry##*:}" +%H:%M:%S); \
$(tail -n 1 "$ROOT/$label/run.log" | cut -c1-200)"
  done
  log "parallel runs: all ended $(( $(date +%s) - SCRIPT_START ))s after the script began"
fi
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv >>"$OUT_DIR/speed.log" 2>&1
# Versions from the installed metadata: importing vLLM here would cost seconds of the budget.
python3 -c "from importlib.metadata import version as v; print('torch', v('torch'), 'vllm', v('vllm'))" \
  >>"$OUT_DIR/speed.log" 2>&1
tar -czf "$OUT_DIR/runs.tar.gz" -C "$ROOT" --exclude=writer.lock --exclude=triton \
  --exclude=vllm-cache .
log "packed $(du -h "$OUT_DIR/runs.tar.gz" | cut -f1)"
if [ "${SUMMARY:-0}" = 1 ]; then
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 60 python3 bench/acquisition_speed_summary.py \
    "$ROOT" >"$OUT_DIR/summary.md" 2>&1
  log "summary (exit $?):"
  cat "$OUT_DIR/summary.md" | tee -a "$OUT_DIR/speed.log"
fi
log "script wall $(( $(date +%s) - SCRIPT_START ))s"
