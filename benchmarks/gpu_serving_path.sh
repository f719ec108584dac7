#!/usr/bin/env bash
# What the serving path adds on the GPU (issue 41, item 3): one warm engine (Llama-3-8B's shape, random bf16, every
# GPU switch on, gpu_serving_vs_vllm.py's settings) replays the Azure trace's head in process, behind the stdlib
# server (optladder/serving/server.py, what run.py serves) and behind an ASGI one (Starlette under uvicorn, as vLLM
# runs), the modes taking turns; benchmarks/http_overhead.py --gpu does the work, one round a call.
# Here, once: python3 benchmarks/gpu_serving_vs_vllm.py --make-requests ../shared/data/traces/azure_conv_2023.csv \
#               --requests .stage/azure500.json
# Device calls (kind nvidia-h200), back to back on one warm machine:
#   ROUND=0 bash benchmarks/gpu_serving_path.sh     carry: wheelhouse .stage/azure500.json
#   ROUND=1 bash benchmarks/gpu_serving_path.sh     carry: .stage/azure500.json (the wheelhouse stays installed)
# Each writes $OUT/serving_path/r<ROUND>.{md,json} and keeps it in /tmp/serving_path; the last call also writes the
# combined report of every round so far ($OUT/serving_path/serving_path.{md,json}).
# Settings (environment): N requests (300), SCALES (1,4). Modes: in-process, stdlib, asgi, and stdlib-0.5ms (the
# stdlib server under a 0.5 ms GIL switch interval instead of 5 ms: whether the engine waits for the GIL).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-/tmp/out}
ROUND=${ROUND:?ROUND=0, 1, ...: the round this call runs}
mkdir -p "$OUT/serving_path" /tmp/serving_path
source benchmarks/gpu_site.sh "$OUT/serving_path" || exit 1
[ -f .stage/azure500.json ] || { echo "carry .stage/azure500.json (see this script's header)"; exit 2; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  sha256sum benchmarks/http_overhead.py optladder/serving/server.py benchmarks/asgi_server.py; } \
  | tee "$OUT/serving_path/versions-r$ROUND.txt"
export PYTHONUNBUFFERED=1
$PY benchmarks/http_overhead.py --gpu --trace .stage/azure500.json --trace-requests "${N:-300}" \
  --scales "${SCALES:-1,4}" --round "$ROUND" --out "/tmp/serving_path/r$ROUND" 2>&1 | grep -v Warning \
  | tee "$OUT/serving_path/log-r$ROUND.txt" | grep -E "^round|Error|error" | tail -20
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "round $ROUND failed (exit status $rc): see $OUT/serving_path/log-r$ROUND.txt"; exit "$rc"; }
cp /tmp/serving_path/r*.json /tmp/serving_path/r*.md "$OUT/serving_path/" 2>/dev/null
$PY benchmarks/http_overhead.py --combine /tmp/serving_path/r*.json --out "$OUT/serving_path/serving_path" \
  > /dev/null && tail -30 "$OUT/serving_path/serving_path.md"
