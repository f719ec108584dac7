#!/usr/bin/env bash
# Quantization on one GPU in one device call of about 3 minutes (benchmarks/gpu_quant.py): kernel checks,
# llama3_8b_shape decode with bf16 / fp8 / int8 weights and bf16 / fp8 KV against the weight-read floor, KV
# capacity, and SmolLM2's teacher-forced quality of each against the bf16 control. Results under $OUT:
# gpu_quant.{md,json} and the log.
#   bash benchmarks/gpu_quant.sh            (OUT defaults to ./gpu_out)
# SmolLM2 travels as benchmarks/gpu_run.sh stages it: earlier calls on the same warm machine copy .stage/a, then
# .stage/b, to /tmp/stage (`bash benchmarks/gpu_run.sh stage`); this call carries .stage/c.
# Without the pieces the SmolLM2 section fails on its own and the rest still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_smollm2.sh   # SMOL=(--smollm2-cache DIR) when the GGUF pieces are there
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia_smi.txt"
python3 benchmarks/gpu_quant.py --out "$OUT" "${SMOL[@]}" "$@" 2>&1 | tee "$OUT/gpu_quant_log.txt"
