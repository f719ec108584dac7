#!/usr/bin/env bash
# Speculative decoding on the H200 in one device call of about 5 minutes (benchmarks/gpu_spec.py): SmolLM2 bf16
# batch-1 decode with and without speculation on the repeat-heavy and built-in sets, and the 8B shape's Azure
# replay at 1x and 4x with and without ngram speculation. Results under $OUT: gpu_spec.{md,json} and the log.
#   bash benchmarks/gpu_spec.sh            (OUT defaults to ./gpu_out)
# SmolLM2 travels in pieces as for benchmarks/gpu_run.sh (earlier calls on the same warm machine ran
# `bash benchmarks/gpu_run.sh stage` carrying .stage/a, then .stage/b; this call carries .stage/c); the replay needs
# .stage/azure500.json
# (benchmarks/gpu_serving_vs_vllm.sh says how to write it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_smollm2.sh   # sets SMOL=(--smollm2-cache DIR) when the GGUF pieces are there
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia_smi_spec.txt"
python3 benchmarks/gpu_spec.py --out "$OUT" "${SMOL[@]}" "$@" 2>&1 | tee "$OUT/gpu_spec_log.txt"
