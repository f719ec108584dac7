#!/usr/bin/env bash
# Scale-out on the 2-GPU H200 machine (device kind nvidia-h200-x2), all through run.py:
#   sweep: a 2-job opt sweep (reference engine, Llama-3-8B's shape) one job after the other on one GPU
#          (hydra/launcher=local), then both at once on the two GPUs (hydra/launcher=ray): wall times;
#   tp:    Llama-3-70B's shape (dummy weights, 141 GB in bf16: more than one H200) through engine=vllm with
#          engine.server.tensor_parallel_size=2 on a short Azure-trace replay: TTFT/TPOT; and the same asked
#          of one visible GPU, refused with the count before vLLM starts.
# Nothing can be fetched there: the trimmed vLLM 0.26.0 bundle and the project's wheelhouse come as chunks.
# Here, once:
#   echo /.vllm-gpu/ >> .git/info/exclude; bash ../shared/tools/vllm-gpu/build.sh   # .vllm-gpu/c1 c2 manifest.tsv
#   make wheelhouse                                        # wheelhouse/c1 ... manifest.tsv requirements.txt
#   mkdir -p .gpu-data && cp -r ../shared/data/traces ../shared/data/prompts .gpu-data/   # 3.4 MB: the Azure trace
# Device calls (kind nvidia-h200-x2), back to back (the machine keeps /tmp only while it stays warm), each
# carrying <= 64 MiB; measured here: the vLLM bundle is c1 56 + c2 ~30 MiB, the wheelhouse 136.8 MiB in
# c1 56 + c2 56 + c3 ~25 MiB (113 wheels; 82 packages left to the image):
#   1  bash benchmarks/gpu_tp.sh stage   carry: .vllm-gpu/c1 .vllm-gpu/assemble.sh
#   2  bash benchmarks/gpu_tp.sh stage   carry: wheelhouse/c1
#   3  bash benchmarks/gpu_tp.sh stage   carry: wheelhouse/c2
#   4  bash benchmarks/gpu_tp.sh sweep   carry: .vllm-gpu/c2 wheelhouse/c3 .vllm-gpu/manifest.tsv .vllm-gpu/assemble.sh
#                                               wheelhouse/manifest.tsv wheelhouse/requirements.txt .gpu-data
#   5  bash benchmarks/gpu_tp.sh tp      carry: .vllm-gpu/manifest.tsv .vllm-gpu/assemble.sh wheelhouse/manifest.tsv
#                                               wheelhouse/requirements.txt .gpu-data
# (`all` runs sweep then tp in one call when the 10-minute limit allows.) Results under $OUT: gpu_tp.md,
# each run's summary.json, the MLflow database of the runs (mlflow.db) and logs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
MODE=${1:-all}
PY=${PY:-python3}
# NVLink multicast stays off (the machine's rule), also for vLLM's own processes; no symmetric-memory all-reduce
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1  # the bundle has no FlashInfer
export OPTLADDER_DATA=${OPTLADDER_DATA:-$PWD/.gpu-data}

stage() {
  if ls -d .vllm-gpu/c[0-9]* >/dev/null 2>&1; then bash .vllm-gpu/assemble.sh stage; fi
  if ls -d wheelhouse/c[0-9]* >/dev/null 2>&1; then $PY deploy/install.py --from wheelhouse --stage; fi
}

install() {
  stage
  if [ ! -d /tmp/site/vllm ]; then source .vllm-gpu/assemble.sh install || exit 1; fi
  if [ ! -d /tmp/site-optladder/hydra ]; then
    cp wheelhouse/manifest.tsv wheelhouse/requirements.txt /tmp/wheelhouse-stage/ 2>/dev/null
    $PY deploy/install.py --from wheelhouse --target /tmp/site-optladder 2>&1 | tee "$OUT/install.log" || exit 1
  fi
  # ours first: where a vLLM-bundle pin conflicts with the project (cachetools), the project's copy wins
  export PYTHONPATH=/tmp/site-optladder:/tmp/site
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/nvidia_smi.txt"
  $PY -c "import torch, vllm, hydra, mlflow, ray; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(),
  'vllm', vllm.__version__, 'mlflow', mlflow.__version__, 'ray', ray.__version__)" | tee "$OUT/versions.txt"
}

timed() {  # timed NAME cmd...: wall seconds into $OUT/times.tsv, output into $OUT/NAME.log
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$((SECONDS - t0))" "$rc" | tee -a "$OUT/times.tsv"
  [ "$rc" = 0 ] || tail -40 "$OUT/$name.log"
}

RAY_EXTRA=()
TRACK="tracking.uri=sqlite:///$OUT/mlflow.db tracking.system_metrics=false replay.progress=false"
SWEEP=(model=llama3_8b_shape workload=azure_conv workload.num_requests=200 quality.num_prompts=50
       engine.max_model_len=4096 engine.kv_cache_gb=16
       '+opt=[paged_kv,dynamic_batching,batched_decode],[paged_kv,dynamic_batching,batched_decode,flash_attn,cuda_graphs]')
if [ -n "${SMOKE:-}" ]; then  # the CPU path, here: the same steps on the tiny model, logical GPUs for Ray
  SWEEP=(model=tiny workload=azure_conv workload.num_requests=4 quality.num_prompts=2 quality.max_new_tokens=8
         engine.max_model_len=1024 engine.kv_cache_gb=0.05 engine.cpu_threads=1
         '+opt=[paged_kv,dynamic_batching],[paged_kv,dynamic_batching,flash_attn]')
  RAY_EXTRA=(hydra.launcher.num_gpus=2)
fi
TP=(engine=vllm model=llama3_70b_shape engine.server.tensor_parallel_size=2 engine.max_model_len=8192
    engine.kv_cache_gb=null engine.kv_cache_memory_fraction=0.9 engine.server.startup_timeout_s=480
    workload=azure_conv workload.num_requests=100 quality.num_prompts=20)

sweep() {
  timed sweep_local_1gpu env CUDA_VISIBLE_DEVICES=0 $PY run.py -m hydra/launcher=local "${SWEEP[@]}" $TRACK \
    hydra.sweep.dir="$OUT/sweep_local"
  timed sweep_ray_2gpu $PY run.py -m hydra/launcher=ray "${SWEEP[@]}" "${RAY_EXTRA[@]}" $TRACK \
    hydra.sweep.dir="$OUT/sweep_ray"
}

tp() {
  timed tp_refused_on_1gpu env CUDA_VISIBLE_DEVICES=0 $PY run.py "${TP[@]}" $TRACK hydra.run.dir="$OUT/tp1_refused"
  timed tp2_70b $PY run.py "${TP[@]}" $TRACK hydra.run.dir="$OUT/tp2_70b"
  if ! [ -f "$OUT/tp2_70b/summary.json" ]; then  # once more without vLLM's custom all-reduce and graphs
    timed tp2_70b_eager $PY run.py "${TP[@]}" "engine.server.extra_args=[--disable-custom-all-reduce,--enforce-eager]" \
      $TRACK hydra.run.dir="$OUT/tp2_70b_eager"
  fi
}

[ -n "${SMOKE:-}" ] && install() { :; }  # here: the project's own environment
case "$MODE" in
  stage) stage ;;
  sweep) install; sweep ;;
  tp) install; tp ;;
  all) install; sweep; tp ;;
  *) echo "usage: $0 stage|sweep|tp|all"; exit 2 ;;
esac
[ "$MODE" = stage ] || $PY benchmarks/scale_report.py "$OUT" | tee "$OUT/gpu_tp.md"
cp -r mlartifacts "$OUT/" 2>/dev/null || true
