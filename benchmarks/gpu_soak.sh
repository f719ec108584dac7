#!/usr/bin/env bash
# The H200 soak in one device call of at most 10 minutes: 8 minutes of the builtin workload at 8 req/s in a
# loop, Llama-3-8B's shape (random bf16 weights), every lossless switch on, 5% bad requests; results under $OUT.
#   bash benchmarks/gpu_soak.sh            (OUT defaults to ./gpu_out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT/soak"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/soak/nvidia_smi.txt"
timeout 570 python3 benchmarks/gpu_soak.py --out "$OUT/soak" "$@" 2>&1 | tee "$OUT/soak/log.txt"
