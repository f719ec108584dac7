#!/usr/bin/env bash
# The flash_attn and cuda_graphs GPU run in one device call: GPU tests, then benchmarks/gpu_bench.py, outputs under $OUT.
#   bash benchmarks/gpu_run.sh            (OUT defaults to ./gpu_out)
# SmolLM2's 98 MB GGUF file does not fit one call's 64 MiB, so it travels in pieces (benchmarks/stage_smollm2.sh:
# .stage/a, .stage/b, .stage/c): earlier calls on the same warm machine copy .stage/a, then .stage/b, to /tmp/stage
# (`bash benchmarks/gpu_run.sh stage`, carrying one each); this call carries .stage/c, joins the pieces
# (benchmarks/gpu_smollm2.sh) and lets optladder/engine/loader.py convert the file as it does on any machine. Without the
# pieces the SmolLM2 section is skipped and the rest still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT" /tmp/stage
if [ "${1:-}" = stage ]; then SMOLLM2_STAGE_ONLY=1 source benchmarks/gpu_smollm2.sh; exit; fi  # the pieces carried
export PYTHONUNBUFFERED=1
source benchmarks/gpu_smollm2.sh   # SMOL=(--smollm2-cache DIR) when the GGUF pieces are there
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia_smi.txt"
# the GPU tests (conftest.py needs Hydra, which the GPU image lacks: these tests need none of it)
python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_gpu_paths.py 2>&1 | tee "$OUT/pytest_gpu.txt"
python3 benchmarks/gpu_bench.py --out "$OUT" "${SMOL[@]}" "$@" 2>&1 | tee "$OUT/bench_log.txt"
