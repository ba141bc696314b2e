#!/usr/bin/env bash
# Issue 19 on one H200 (session 10): the start phases profiled cold, the default factor-2 grid
# of Qwen3-30B-A3B bf16 over its three vllm-modular targets with six control attempts (the
# default since session 8), then the start phases again with vLLM's bytecode written.
# Run on the GPU machine from the repository root, kit staged and env.sh sourced:
#   bash scripts/h200_speed_session10.sh
# $OUT receives adm/{cold,warm}.{txt,json} and what scripts/h200_acquisition_speed.sh returns.
set -uo pipefail
OUT=${OUT:-var/speed-out}
mkdir -p "$OUT/adm"
SLICE=(slice Qwen/Qwen3-30B-A3B-Instruct-2507 --hardware H200 --tp 1 --tp-refresh 1 --group moe
  --max-num-batched-tokens 2048 --max-num-seqs 128 --moe-rounds 3 --measurement-iterations 3
  --moe-grid-factor 2 --cudagraph-capture-sizes 1,2,4,8,16,32,64,128,256 --dp 1,2
  --backend vllm-modular --out-root /tmp/adm-out)
# Cold: no .pyc is written, so the acquisition after it starts as cold as session 8's call 24.
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=.:${PYTHONPATH:-} timeout 60 python3 bench/acquisition_admission_cost.py \
  --json "$OUT/adm/cold.json" -- "${SLICE[@]}" >"$OUT/adm/cold.txt" 2>&1
echo "admission bench (cold): exit $?" | tee -a "$OUT/adm/status.txt"
BUDGET_S=${BUDGET_S:-440} SUMMARY=1 ROOT=${ROOT:-/tmp/speed10} EXTRA_ARGS="--moe-kernel-steps v2" \
  bash scripts/h200_acquisition_speed.sh modular-six=.:vllm-modular:2:1,2:410
PYTHONPATH=.:${PYTHONPATH:-} timeout 40 python3 bench/acquisition_admission_cost.py \
  --json "$OUT/adm/warm.json" -- "${SLICE[@]}" >"$OUT/adm/warm.txt" 2>&1
echo "admission bench (warm): exit $?" | tee -a "$OUT/adm/status.txt"
