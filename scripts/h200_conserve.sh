#!/usr/bin/env bash
# Issue 14: conservation traces for the shipped H200 tables acquired before session 4.
#
# One process (`python -m acquisition conserve`, acquisition/conserve.py) rebuilds, for every
# table without conservation.csv, the backend its contract names on this GPU and runs only the
# build's conservation traces; the rows are attached to a copy of each bundle under $STAGE as
# supplementary evidence (the contract says when, how and on what they were measured). Tables
# and stability files keep their bytes; each bundle is written whole or not at all. It refuses
# a host whose GPU name, torch or vLLM version differs from a table's contract.
#
# Run on the GPU machine from the repository root, kit staged:
#   bash .kit/bin/stage.sh && source .kit/bin/env.sh && bash scripts/h200_conserve.sh [BUNDLE...]
# Default bundles: every variant folder under $BUNDLES_ROOT/H200*/ with a table lacking
# conservation.csv (21 tables in 5 bundles at the time of writing).
# $OUT receives conserve.log (the command, its output, each bundle's validation), progress.jsonl,
# summary.txt (one line), and conserve-bundles.tar.gz: the updated variant folders under
# bundles/..., to unpack at the repository root (`tar -xzf conserve-bundles.tar.gz`).
# Environment: CONSERVE_S (limit of the command, default 270), PYTHON, STAGE (kept between calls:
# bundles already written there are not traced again, only packed), BUNDLES_ROOT, REPO_DIR (the
# repository root; default: this script's parent folder).
set -uo pipefail
SCRIPTS=$(cd "$(dirname "$0")" && pwd)
cd "${REPO_DIR:-$SCRIPTS/..}"
OUT_DIR=${OUT:-var/conserve-out}
STAGE=${STAGE:-/tmp/conserve-stage}
PYTHON=${PYTHON:-python3}
LIMIT_S=${CONSERVE_S:-270}
BUNDLES_ROOT=${BUNDLES_ROOT:-bundles}
mkdir -p "$OUT_DIR" "$STAGE"
export PYTHONUNBUFFERED=1
LOG=$OUT_DIR/conserve.log
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }

bundles=("$@")
if [ "${#bundles[@]}" -eq 0 ]; then
  while IFS= read -r meta; do
    variant=$(dirname "$meta")
    for table in "$variant"/tp*/moe_components/*/; do
      if [ -f "$table/components.csv" ] && [ ! -f "$table/conservation.csv" ]; then
        bundles+=("$variant")
        break
      fi
    done
  done < <(find "$BUNDLES_ROOT" -path "$BUNDLES_ROOT/H200*" -name meta.yaml | sort)
fi
if [ "${#bundles[@]}" -eq 0 ]; then
  log "nothing to do: every H200 table has conservation.csv"
  echo "conserve: nothing to do" >"$OUT_DIR/summary.txt"
  exit 0
fi
tables=0
for b in "${bundles[@]}"; do
  for table in "$b"/tp*/moe_components/*/; do
    [ -f "$table/conservation.csv" ] || tables=$((tables + 1))
  done
done
log "${#bundles[@]} bundles, $tables tables without conservation: ${bundles[*]}"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader >>"$LOG" 2>&1 || true

# A bundle written by an earlier call on this (still warm) machine is kept and packed again:
# a call stopped by its limit is completed by running the same command once more.
todo=()
for b in "${bundles[@]}"; do
  if [ -f "$STAGE/$b/meta.yaml" ]; then
    log "$b: written by an earlier call on this machine, kept"
  else
    todo+=("$b")
  fi
done
status=0
wall=0
if [ "${#todo[@]}" -gt 0 ]; then
  cmd=("$PYTHON" -m acquisition conserve --out "$STAGE" --progress-json "$OUT_DIR/progress.jsonl"
    --no-progress-bar "${todo[@]}")
  log "timeout $LIMIT_S ${cmd[*]}"
  start=$(date +%s)
  timeout --signal=TERM --kill-after=20 "$LIMIT_S" "${cmd[@]}" >>"$LOG" 2>&1
  status=$?
  wall=$(($(date +%s) - start))
  log "conserve: exit $status after ${wall}s"
fi

# Each written bundle is complete (staged and validated by the writer); validate it again here.
written=0
valid=0
packed=()
for b in "${bundles[@]}"; do
  if [ -f "$STAGE/$b/meta.yaml" ]; then
    written=$((written + 1))
    packed+=("$b")
    if "$PYTHON" -m moetables validate "$STAGE/$b" >>"$LOG" 2>&1; then
      valid=$((valid + 1))
      # Per table and forward: the sums, the activities outside the scopes, the table's own
      # local times at the same rows.
      "$PYTHON" "$SCRIPTS/h200_conservation.py" "$STAGE/$b" >>"$LOG" 2>&1 || true
    else
      log "$b: INVALID after writing"
      status=1
    fi
  else
    log "$b: not written (see above)"
  fi
done
if [ "$written" -gt 0 ]; then
  tar -czf "$OUT_DIR/conserve-bundles.tar.gz" -C "$STAGE" --exclude='.*.meta.lock' "${packed[@]}"
fi
line="conserve: exit $status after ${wall}s; $written of ${#bundles[@]} bundles written, $valid valid"
echo "$line" >"$OUT_DIR/summary.txt"
log "$line"
grep -E "traced|wrote|error|refused|not the table" "$LOG" | tail -n 40
exit "$status"
