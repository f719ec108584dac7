#!/usr/bin/env bash
# The latency gate's error rates on the GPU (benchmarks/error_rates.py): SmolLM2-135M-Instruct in bf16, switchback
# A/Bs (both arms loaded at once, the trace in blocks), 20 A/As and 10 each of a candidate +10% and +20% slower a
# step, interleaved; results under $OUT/error_rates/ (results.json, table.md, one verdict per A/B).
# Staged like benchmarks/gpu_near_tie.sh (its three `stage` calls: wheelhouse, .stage/a, .stage/b), then
#   bash benchmarks/gpu_error_rates.sh      carry: .stage/c .gpu-data   (or nothing, on the machine that has them)
# Settings (environment): N requests (100) at RATE a second (20) in BLOCKS blocks (10), or WORKLOAD (overrides
# instead of workload.rate); OPTS (the switches of both arms, e.g. [paged_kv,cuda_graphs]); AA (20), RUNS (10) and
# SLOWDOWNS (0.1,0.2): how many A/Bs of each kind; DEADLINE_S (520): no A/B starts after it; EXTRA: more overrides.
# The all-on run of 2026-12-07 (benchmarks/results/error_rates/README.md):
#   OPTS=[paged_kv,flash_attn,dynamic_batching,chunked_prefill,batched_decode,cuda_graphs,fused_kernels] N=300
#   BLOCKS=15 WORKLOAD="workload=azure_conv workload.sampling=head workload.time_scale=0.25"
#   EXTRA="engine.max_num_seqs=64 engine.kv_cache_gb=4 ++gate.latency_max_regression={perf/e2e_ms_p99:null,perf/e2e_ms_p90:0.1}"
#   bash benchmarks/gpu_error_rates.sh      (a later session: RESUME_FROM=benchmarks/results/error_rates/gpu_h100_allon.json)
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
# the workload: WORKLOAD (overrides; default the builtin one at RATE a second), N requests; OPTS: the engine's
# switches in both arms (default none: the eager engine)
set -f
WL=(${WORKLOAD:-workload.rate=${RATE:-20}})
[ -n "${OPTS:-}" ] && WL+=("+opt=$OPTS")
# the data (traces, prompts) for a workload= of a real trace: .gpu-data, carried by the first call, kept in
# /tmp/gpu-data for the next ones (mkdir -p .gpu-data && cp -r ../shared/data/traces .gpu-data/)
if [ -d .gpu-data ]; then mkdir -p /tmp/gpu-data && cp -r .gpu-data/. /tmp/gpu-data/; fi
[ -d /tmp/gpu-data ] && export OPTLADDER_DATA=${OPTLADDER_DATA:-/tmp/gpu-data}
# kept in /tmp between calls on one warm machine: a second call goes on where the first stopped (--resume)
# RESUME_FROM (a results.json in the checkout, e.g. benchmarks/results/error_rates/gpu_h100_allon.json): a fresh
# machine goes on from the A/Bs an earlier session committed (the same overrides, or error_rates.py refuses). Only
# the rows come back: the earlier A/Bs' raw/ timings stay in the committed .tgz (merge the new raw/ into it), and
# the header names the new machine (check that it is the same kind of card). STATE: another settings' state dir.
ST=${STATE:-/tmp/error_rates-state}
mkdir -p "$ST"
if [ -n "${RESUME_FROM:-}" ] && [ ! -f "$ST/results.json" ]; then
  cp "$RESUME_FROM" "$ST/results.json" || { echo "RESUME_FROM=$RESUME_FROM: no such file"; exit 2; }
fi
$PY benchmarks/error_rates.py --resume --out "$ST" --aa "${AA:-20}" --slowdowns "${SLOWDOWNS:-0.1,0.2}" \
  --runs "${RUNS:-10}" --deadline-s "${DEADLINE_S:-520}" -- model=smollm2_135m engine.dtype=bfloat16 \
  engine.device=cuda engine.max_model_len=2048 ab.design=switchback ab.blocks="${BLOCKS:-10}" \
  workload.num_requests="${N:-100}" quality.num_prompts=4 "${WL[@]}" ${EXTRA:-} 2>&1 | grep -v Warning \
  >> "$ST/log.txt"
set +f
cp -r "$ST"/results.json "$ST"/table.md "$ST"/log.txt "$ST"/verdicts "$ST"/raw "$OUT/error_rates/" 2>/dev/null
cp "$OUT/error_rates/versions.txt" "$ST/" 2>/dev/null
tail -8 "$OUT/error_rates/log.txt"
