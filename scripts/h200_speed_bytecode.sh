#!/usr/bin/env bash
# Issue 19 on one H200 (session 10): the default factor-2 grid with bytecode, as a pip install
# leaves it. The lent machine sets PYTHONDONTWRITEBYTECODE=1 and its site-packages hold no
# .pyc, so every process compiles torch, transformers and vLLM from source. Here the modules an
# acquisition imports are compiled once into a cache prefix (staging, as pip's install step),
# then the run and the start-phase bench read them from there.
# Run on the GPU machine from the repository root, kit staged and env.sh sourced:
#   bash scripts/h200_speed_bytecode.sh
set -uo pipefail
OUT=${OUT:-var/speed-out}
mkdir -p "$OUT/adm"
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/root/pyc}
unset PYTHONDONTWRITEBYTECODE
IMPORT="import vllm.model_executor.layers.fused_moe, acquisition.adapters.vllm_modular_backend"
for pass in write read; do
  start=$(date +%s%N)
  PYTHONPATH=.:${PYTHONPATH:-} python3 -c "$IMPORT"
  echo "import with the cache prefix ($pass): $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$OUT/adm/status.txt"
done
echo "prefix $PYTHONPYCACHEPREFIX: $(du -sh "$PYTHONPYCACHEPREFIX" | cut -f1)" | tee -a "$OUT/adm/status.txt"
BUDGET_S=${BUDGET_S:-380} SUMMARY=1 ROOT=${ROOT:-/tmp/speed10b} EXTRA_ARGS="--moe-kernel-steps v2" \
  bash scripts/h200_acquisition_speed.sh modular-six-bytecode=.:vllm-modular:2:1,2:350
PYTHONPATH=.:${PYTHONPATH:-} timeout 40 python3 bench/acquisition_admission_cost.py \
  --json "$OUT/adm/bytecode.json" -- slice Qwen/Qwen3-30B-A3B-Instruct-2507 --hardware H200 \
  --tp 1 --tp-refresh 1 --group moe --max-num-batched-tokens 2048 --max-num-seqs 128 \
  --moe-rounds 3 --measurement-iterations 3 --moe-grid-factor 2 \
  --cudagraph-capture-sizes 1,2,4,8,16,32,64,128,256 --dp 1,2 --backend vllm-modular \
  --out-root /tmp/adm-out >"$OUT/adm/bytecode.txt" 2>&1
echo "admission bench (bytecode): exit $?" | tee -a "$OUT/adm/status.txt"
