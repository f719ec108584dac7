#!/usr/bin/env bash
# The near-tie lossless check calibrated on the H200 (benchmarks/near_tie_calibration.py): SmolLM2-135M-Instruct,
# real weights in bf16, the 200 built-in quality prompts; each lossless switch (the GPU ones too) must pass, each
# bug planted in one (engine.debug_plant) is reported. Results under $OUT/near_tie/ (cases.json, table.md, logs).
# Here, once:
#   python deploy/wheelhouse.py --out wheelhouse --extras '' --no-vllm-serve   # hydra, omegaconf, mlflow, ...
#   bash benchmarks/stage_smollm2.sh                                           # .stage/a, b, c: the GGUF in pieces
# Device calls back to back on one warm machine (/tmp survives ~30 s between calls):
#   1  bash benchmarks/gpu_near_tie.sh stage   carry: wheelhouse      (installs into /tmp/site-optladder)
#   2  bash benchmarks/gpu_near_tie.sh stage   carry: .stage/a
#   3  bash benchmarks/gpu_near_tie.sh stage   carry: .stage/b
#   4  bash benchmarks/gpu_near_tie.sh run     carry: .stage/c
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: $0 stage|run}
PY=${PY:-python3}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/near_tie"
source benchmarks/gpu_site.sh "$OUT/near_tie" || exit 1
if [ "$MODE" = stage ]; then
  SMOLLM2_STAGE_ONLY=1 source benchmarks/gpu_smollm2.sh
  exit $?
fi
source benchmarks/gpu_smollm2.sh
[ ${#SMOL[@]} -gt 0 ] || { echo "the GGUF pieces are not all here: see this script's header"; exit 2; }
export OPTLADDER_CACHE=/tmp/stage/cache
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import sys, torch, transformers, hydra; print('python', sys.version.split()[0], 'torch', torch.__version__,
  'transformers', transformers.__version__, 'hydra', hydra.__version__)"; git rev-parse HEAD 2>/dev/null; } \
  | tee "$OUT/near_tie/versions.txt"
COMMON=(model=smollm2_135m engine.dtype=bfloat16 engine.device=cuda engine.max_model_len=2048)
$PY benchmarks/near_tie_calibration.py --out "$OUT/near_tie/default" \
  --cases paged_kv,flash_attn,dynamic_batching,batched_decode,prefix_cache,speculative,cuda_graphs,fused_kernels,plant:kv_block_off_by_one:dynamic_batching,plant:stale_kv_slot:batched_decode \
  -- "${COMMON[@]}" 2>&1 | tee "$OUT/near_tie/default.log" | grep -v Warning
# chunked prefill only chunks a prompt when a step's token budget runs out: a small budget chunks most of them
$PY benchmarks/near_tie_calibration.py --out "$OUT/near_tie/chunked" \
  --cases chunked_prefill,plant:rope_off_by_one_chunk:chunked_prefill \
  -- "${COMMON[@]}" engine.max_num_batched_tokens=128 2>&1 | tee "$OUT/near_tie/chunked.log" | grep -v Warning
