#!/usr/bin/env bash
# Device side of the layer-estimate validation (issue 11 parts 3 and 5; issue 16 with DP=4;
# issue 18 part 3 with DP=1: one TP1 engine on one GPU, no EP).
# Run from the project root on the GPU machine after the kit is staged and `source .kit/bin/env.sh`:
#   DP=2 bash scripts/h200x2_estimate_run.sh sweep simulator native
#   DP=1 REPS=5 bash scripts/h200x2_estimate_run.sh simulator normal_routing
# Each part writes under $OUT: nccl_sweep.json (+ sweep.log), validation/<routing>/rank<r>.json
# (+ validation_<routing>.log), and the host's topology (topo.txt, gpus.csv). `simulator` is vLLM's
# routing simulator with uniform_random, `normal_routing` the same simulator skewed, `native` the
# engine's own router.
set -u
OUT=${OUT:-/tmp/out}
DP=${DP:-2}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mkdir -p "$OUT"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1 || true
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/gpus.csv" 2>&1 || true
port=29571
for part in "$@"; do
  t0=$(date +%s)
  case $part in
    sweep)
      timeout "${SWEEP_TIMEOUT:-240}" python3 scripts/h200x2_nccl_sweep.py run --nproc "$DP" \
        --out "$OUT/nccl_sweep.json" > "$OUT/sweep.log" 2>&1
      echo "sweep: rc=$? in $(( $(date +%s) - t0 )) s"; tail -n 8 "$OUT/sweep.log" ;;
    simulator|native|normal_routing)
      if [ "$part" = normal_routing ]; then routing=(--routing simulator --strategy normal_routing)
      else routing=(--routing "$part"); fi
      timeout "${VAL_TIMEOUT:-420}" python3 scripts/h200x2_estimate_validation.py run --dp "$DP" \
        "${routing[@]}" --out "$OUT/validation" --port "$port" --timeout "$(( ${VAL_TIMEOUT:-420} - 20 ))" \
        ${REPS:+--reps "$REPS"} > "$OUT/validation_$part.log" 2>&1
      echo "$part: rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "^rank |exit codes|Error|error" "$OUT/validation_$part.log" | tail -n 12
      port=$(( port + 10 )) ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
