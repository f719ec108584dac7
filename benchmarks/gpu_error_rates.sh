#!/usr/bin/env bash
# The latency gate's error rates on the GPU (benchmarks/error_rates.py): SmolLM2-135M-Instruct in bf16, switchback
# A/Bs (both arms loaded at once, the trace in blocks), 20 A/As and 10 each of a candidate +10% and +20% slower a
# step, interleaved; results under $OUT/error_rates/ (results.json, table.md, one verdict per A/B).
# Staged like benchmarks/gpu_near_tie.sh (its three `stage` calls: wheelhouse, .stage/a, .stage/b), then
#   bash benchmarks/gpu_error_rates.sh      carry: .stage/c   (or nothing, on the machine that already joined them)
# Settings (environment): N requests (100) at RATE a second (20) in BLOCKS blocks (10); DEADLINE_S (520): no A/B
# starts after it; EXTRA: more overrides.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/error_rates"
source benchmarks/gpu_site.sh "$OUT/error_rates" || exit 1
source benchmarks/gpu_smollm2.sh
[ ${#SMOL[@]} -gt 0 ] || { echo "the GGUF pieces are not all here: see benchmarks/gpu_near_tie.sh"; exit 2; }
export OPTLADDER_CACHE=/tmp/stage/cache
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"; } \
  | tee "$OUT/error_rates/versions.txt"
$PY benchmarks/error_rates.py --out "$OUT/error_rates" --aa 20 --slowdowns 0.1,0.2 --runs 10 \
  --deadline-s "${DEADLINE_S:-520}" -- model=smollm2_135m engine.dtype=bfloat16 engine.device=cuda \
  engine.max_model_len=2048 ab.design=switchback ab.blocks="${BLOCKS:-10}" workload.num_requests="${N:-100}" \
  workload.rate="${RATE:-20}" quality.num_prompts=4 ${EXTRA:-} 2>&1 | grep -v Warning > "$OUT/error_rates/log.txt"
tail -8 "$OUT/error_rates/log.txt"
