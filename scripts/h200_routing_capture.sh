#!/usr/bin/env bash
# Issue 15 part 4: captured routing on the H200s, end to end (capture ran 2026-12-01 on one H200:
# docs/evidence/h200-routing/README.md; validate needs two GPUs and has not run yet).
# On an nvidia-h200-x2 machine, from the project root, after the kit is staged and
# `source .kit/bin/env.sh` (see /work/shared/gpu/vllm-kit/README.md):
#   bash scripts/h200_routing_capture.sh capture validate
# then on CPU (here):
#   python scripts/h200_routing_capture.py compare $OUT --bundle bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16 \
#       --cluster clusters/h200x2-nvlink.yaml --out docs/evidence/h200-routing/comparison.json
# capture:  `python -m acquisition routing` on Qwen3-30B-A3B (dummy weights, eager, GPU 0) twice:
#           vLLM's routing simulator with normal_routing (skewed) and the engine's own router;
#           writes $OUT/normal_routing.routing.npz and $OUT/native.routing.npz (+ progress, logs).
# validate: the DP2/EP2 engine of scripts/h200x2_estimate_validation.py under the same two routers:
#           per block forward the tokens, the captured per-expert counts and the measured expert
#           compute (launch correlation), under $OUT/validation/{normal_routing,native}/rank<r>.json.
set -u
OUT=${OUT:-/tmp/out}
LAYERS=${LAYERS:-}            # e.g. 1 for the one-layer prefix; empty: all 48 layers
PROMPTS=${PROMPTS:-64}
MAX_TOKENS=${MAX_TOKENS:-32}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mkdir -p "$OUT"
MODEL_DIR=$(mktemp -d /tmp/routing-qwen3-XXXX)
cp acquisition/catalog/Qwen/Qwen3-30B-A3B-Instruct-2507/config.json "$MODEL_DIR/"
python3 scripts/h200_routing_capture.py prompts --out "$OUT/prompts.jsonl" --count "$PROMPTS"
port=29671
for part in "$@"; do
  t0=$(date +%s)
  case $part in
    capture)
      for router in normal_routing native; do
        CUDA_VISIBLE_DEVICES=0 timeout "${CAPTURE_TIMEOUT:-420}" python3 -m acquisition routing "$MODEL_DIR" \
          --prompts "$OUT/prompts.jsonl" --max-tokens "$MAX_TOKENS" --batch-prompts 16 \
          --engine vllm --router "$router" --model-name Qwen/Qwen3-30B-A3B-Instruct-2507 --load-format dummy --attention-backend TRITON_ATTN \
          --max-model-len 4096 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.85 \
          ${LAYERS:+--hf-overrides "{\"num_hidden_layers\": $LAYERS}"} \
          --out "$OUT/$router.routing.npz" --progress-json "$OUT/capture_$router.jsonl" \
          --no-progress-bar > "$OUT/capture_$router.log" 2>&1
        echo "capture $router: rc=$? in $(( $(date +%s) - t0 )) s"; tail -n 3 "$OUT/capture_$router.log"
      done ;;
    validate)
      timeout "${VAL_TIMEOUT:-420}" python3 scripts/h200x2_estimate_validation.py run --dp 2 \
        --routing simulator --strategy normal_routing --out "$OUT/validation" --port "$port" \
        --timeout "$(( ${VAL_TIMEOUT:-420} - 20 ))" > "$OUT/validation_normal_routing.log" 2>&1
      echo "validate normal_routing: rc=$?"; grep -E "^rank |exit codes|Error" "$OUT/validation_normal_routing.log" | tail -n 6
      port=$(( port + 10 ))
      timeout "${VAL_TIMEOUT:-420}" python3 scripts/h200x2_estimate_validation.py run --dp 2 \
        --routing native --out "$OUT/validation" --port "$port" \
        --timeout "$(( ${VAL_TIMEOUT:-420} - 20 ))" > "$OUT/validation_native.log" 2>&1
      echo "validate native: rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "^rank |exit codes|Error" "$OUT/validation_native.log" | tail -n 6 ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
