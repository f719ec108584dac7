#!/usr/bin/env bash
# The engine A/B on the H200, through run.py only: `+ab=engine_vllm`, the reference engine (control) against
# `vllm serve` 0.26.0 (candidate), both with every GPU switch on and both over HTTP through the same client
# (replay.driver=locust puts the reference engine behind optladder/serving/server.py; engine=vllm is always HTTP), on
# Llama-3-8B's shape with random bf16 weights (vLLM: the shape's config.json + --load-format dummy,
# optladder/backends/vllm_model.py) over the first 500 requests of the Azure conversation trace at its own timestamps.
# Both arms get the same limits: engine.max_model_len=4096, engine.max_num_seqs=256, max_num_batched_tokens
# 8192 (the default), engine.block_size=16, KV budget engine.kv_cache_gb=60 (GiB; vLLM: --kv-cache-memory-bytes
# of the same bytes, optladder/backends/vllm_args.py). The opts are given to the base command line, not to ab.control, so
# both arms get them: vLLM maps them onto FLASH_ATTN, cudagraph_mode FULL_AND_PIECEWISE (cuda_graphs with
# piecewise_graphs; FULL_DECODE_ONLY with cuda_graphs alone) and chunked prefill (with them only in the control,
# vLLM would run its Triton attention without graphs nor chunked prefill). The default OPTS include
# piecewise_graphs, so vLLM runs its default graph mode (the reference engine's pieces were level with its eager
# mixed steps at a 2,048-token cap, benchmarks/results/gpu_piecewise_h200_v2.md; the default cap is 256 now, not
# measured in a replay), and fused_kernels (vLLM: always on), without which
# the reference engine's graphs capture its eager layer: the first run on the H200 lacked it and its decode
# steps took 9.6 ms (benchmarks/results/gpu_ab_vllm_h200/). skinny_gemm cannot be given to both (vLLM has no
# switch for its GEMMs: refused); it changes little above batch 1 (benchmarks/results/gpu_h200.md).
# The weights of the two arms are different random draws: their outputs and the quality / teacher-forced
# gates compare nothing (the verdict's quality side fails or is inconclusive); the latency metrics are the point.
#
# Three environments on the machine (nothing can be fetched there):
#   /tmp/site            the trimmed vLLM 0.26.0 bundle (../shared/tools/vllm-gpu) + the wheels `vllm serve`
#                        needs beyond it (.vllm-serve-wheels): the vLLM server runs on this alone (plus the
#                        image), through engine.server.python=python3 +engine.server.env.PYTHONPATH=/tmp/site
#   /tmp/site-optladder  the project's wheelhouse (built --no-vllm-serve) + mlflow-export-import: run.py's
#                        PYTHONPATH; the two never share a path, so their pins (cachetools 7 vs 8) cannot clash
# Here, once (each writes an ignored folder):
#   bash ../shared/tools/vllm-gpu/build.sh                   # .vllm-gpu/c1 56.0 MiB, c2 30.0 MiB, manifest.tsv
#   python deploy/wheelhouse.py --out .vllm-serve-wheels --only-vllm-serve       # 52 wheels, 28.1 MiB: c1
#   python deploy/wheelhouse.py --out wheelhouse --extras '' --no-vllm-serve     # 66 wheels, 34.5 MiB: c1
#   mkdir -p .gpu-data && cp -r ../shared/data/traces ../shared/data/prompts .gpu-data/   # 3.3 MiB
#   pip download --no-deps -d .stage/mei mlflow-export-import==1.2.0   # the runs' way home (0.1 MiB)
#   PY=.venv/bin/python bash benchmarks/gpu_ab_vllm.sh check   # both arms composed as run.py will, vLLM's command printed (CPU, 10 s)
# Device calls (kind nvidia-h200), back to back (/tmp survives only while the machine stays warm, ~30 s idle);
# each carries at most 64 MiB with the working tree (tracked files: ~16 MiB since the GPU results of 2026-12-02;
# `git ls-files -z | xargs -0 du -cb | tail -1`):
#   1  bash benchmarks/gpu_ab_vllm.sh stage   carry: .vllm-gpu/c1 .vllm-gpu/assemble.sh   (56 MiB + the tree)
#   2  bash benchmarks/gpu_ab_vllm.sh stage   carry: .vllm-gpu/c2 .vllm-gpu/manifest.tsv .vllm-gpu/assemble.sh
#                                                    .vllm-serve-wheels                      (58.6 MiB + the tree)
#      (these two fitted 64 MiB with a ~4 MiB tree; with today's ~16 MiB use the repacked plan below)
#      (installs vLLM, then the serve wheels into /tmp/site, then imports vLLM's CLI and OpenAI server: ~2 min)
#   3  bash benchmarks/gpu_ab_vllm.sh start   carry: wheelhouse .gpu-data .stage/mei                  (42.5 MiB)
#      (installs ours, checks both arms' configs, starts run.py detached, returns WAIT_S after its start)
#   4… bash benchmarks/gpu_ab_vllm.sh wait    carry: nothing more (exit 124 while it still runs: call again)
# With the tree above ~8 MiB, build.sh's 56 MiB first chunk no longer fits: repack the bundle here into smaller
# chunks
#   rm -rf .vllm-gpu/c[0-9]* && python3 ../shared/tools/vllm-gpu/pack.py /tmp/vllm-bundle-0.26.0/files .vllm-gpu 46
# (the files build.sh left in /tmp; else build.sh again with CAP_MIB=46) and send the serve wheels on their own,
# as the run of 2026-12-02 did (benchmarks/results/gpu_ab_vllm_h200/README.md):
#   1 stage  carry: .vllm-gpu/c1 .vllm-gpu/assemble.sh
#   2 stage  carry: .vllm-gpu/c2 .vllm-gpu/manifest.tsv .vllm-gpu/assemble.sh .gpu-data .stage/mei
#   3 stage  carry: .vllm-serve-wheels                              4 start  carry: wheelhouse      5… wait
# With the tree at ~17 MiB (2026-12-02) a 46 MiB chunk is over a call's 64 MiB by the device tool's count (larger
# than the file bytes): pack with 36 instead (c1 36, c2 36, c3 14 MiB) and add a call:
#   1 stage  carry: .vllm-gpu/c1 .vllm-gpu/assemble.sh              2 stage  carry: .vllm-gpu/c2 .vllm-gpu/assemble.sh .stage/mei
#   3 stage  carry: .vllm-gpu/c3 .vllm-gpu/manifest.tsv .vllm-gpu/assemble.sh .gpu-data
#   4 stage  carry: .vllm-serve-wheels                              5 start  carry: wheelhouse      6… wait
# Every call stages the chunks and manifests it brought into /tmp and installs whatever is complete (vLLM before
# the serve wheels, whose install checks against it), so the folders may be split over the calls in any order.
# Each start/wait ends by exporting the MLflow runs so far (optladder/experiments/runs_transfer.py) and packing the run
# directory, the MLflow store, the export, the vLLM server logs and the logs into $OUT/ab-vllm-<mode>.tgz (15 MiB
# pieces if larger) plus verdict.json; here: `tar xzf`, then `make import-runs FROM=<unpacked>/mlflow-export`.
# Settings (environment): TS (1), N (500), OPTS (the opt list), EXTRA (more overrides, e.g.
# quality.num_prompts=50 to shorten the quality and teacher-forced phases), DEADLINE_S (570: seconds from the
# start by which a call has packed), WAIT_S (DEADLINE_S - 90), AB_S (1500: the detached run's own limit; a
# machine is held 30 minutes). Expected length: control ~4 min (load, graphs, the 130 s replay, quality),
# candidate ~5 min (vLLM start with torch.compile ~1-2 min, replay, quality), then the teacher-forced phase
# (both engines again, vLLM restarted with a 16 GiB KV cache) ~2-3 min: one `start` and one or two `wait`s.
# SMOKE=1 (with `start`) runs the same steps here on the tiny model on the CPU with this checkout's environment (the
# CPU check of the detached run and the packing; the candidate needs .venv-vllm here, else it fails at its start).
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_detached.sh  # detach, wait_rc, split_archive
OUT=${OUT:-$PWD/gpu_out}
MODE=${1:-start}
JOB=${JOB:-ab}  # ab: the engine A/B above; ladder: the vLLM ladder (benchmarks/gpu_vllm_ladder.sh says how)
PY=${PY:-python3}
TS=${TS:-1}
N=${N:-500}
OPTS=${OPTS:-"[paged_kv,flash_attn,dynamic_batching,chunked_prefill,batched_decode,cuda_graphs,piecewise_graphs,fused_kernels]"}
DEADLINE_S=${DEADLINE_S:-570}  # seconds from this script's start by which everything is packed (a call: 600)
WAIT_S=${WAIT_S:-$((DEADLINE_S - 90))}
STATE=${STATE:-/tmp/optladder-$JOB-vllm}
# vLLM checks at its start that free GPU memory >= gpu_memory_utilization x total (0.9: 127 GB), even though with
# --kv-cache-memory-bytes (engine.kv_cache_gb) nothing else reads it; in the teacher-forced phase the reference
# engine (16 GB of weights + 16 GiB of KV) is loaded beside it: 0.5 (70 GB) passes there, and in the replay
# (run.py holds nothing on the GPU then: run_arms frees what the control's engine left). With engine.kv_cache_gb
# the launch asks for 0.2 by itself (optladder/backends/vllm_args.py); this A/B passes its own, which wins.
VLLM_GMU=${VLLM_GMU:-0.5}
VSITE=${VSITE:-/tmp/site}             # vLLM + the serve wheels: the vLLM server's PYTHONPATH
OSITE=${OSITE:-/tmp/site-optladder}   # the project's wheelhouse: run.py's PYTHONPATH
RUNPATH=$OSITE  # run.py's PYTHONPATH: ours, and for JOB=ladder SmolLM2's package and the gguf reader
case "$MODE" in stage|start|wait|check) ;; *) echo "usage: $0 stage|start|wait|check"; exit 2 ;; esac
case "$JOB" in ab|ladder) ;; *) echo "JOB=$JOB: ab or ladder"; exit 2 ;; esac
mkdir -p "$STATE/logs"; [ "$MODE" = check ] || mkdir -p "$OUT"
# the data: .gpu-data, kept in /tmp/gpu-data by the call that brought it (the detached run outlives the call)
export PYTHONUNBUFFERED=1 OPTLADDER_DATA=${OPTLADDER_DATA:-/tmp/gpu-data}
export OPTLADDER_CACHE=${OPTLADDER_CACHE:-$STATE/cache}  # the model folder vLLM reads (config.json + tokenizer)
# the bundle has no FlashInfer (its sampler must stay off); nothing is reachable from the machine
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

set -f  # OPTS and EXTRA are split into overrides, never expanded as file patterns ([a,b] is one)
ARGS=(+ab=engine_vllm model=llama3_8b_shape workload=azure_conv workload.num_requests="$N" workload.sampling=head
      workload.time_scale="$TS" engine.max_model_len=4096 engine.kv_cache_gb=60 engine.max_num_seqs=256
      engine.block_size=16 replay.driver=locust "+opt=$OPTS"
      engine.server.python=python3 "+engine.server.env.PYTHONPATH=$VSITE"
      "+engine.server.env.VLLM_USE_FLASHINFER_SAMPLER='0'"
      "engine.server.extra_args=[--gpu-memory-utilization,$VLLM_GMU]" engine.server.startup_timeout_s=480
      replay.progress=false tracking.system_metrics=false
      "tracking.uri=sqlite:///$STATE/mlflow/mlflow.db" ${EXTRA:-})
if [ "$JOB" = ladder ]; then  # +ladder=vllm on SmolLM2 (real weights), switchback rungs (gpu_vllm_ladder.sh)
  ARGS=(engine=vllm +ladder=vllm model=smollm2_135m engine.dtype=bfloat16 engine.device=cuda workload=azure_conv
        workload.num_requests="${N_LADDER:-300}" workload.sampling=head workload.time_scale="${TS_LADDER:-0.25}"
        engine.flash_attn=true engine.max_model_len=2048 engine.kv_cache_gb=4 engine.block_size=16
        engine.max_num_seqs=64
        ladder.design=switchback ladder.blocks="${BLOCKS:-15}" ladder.looks="${LOOKS:-3}"
        "++gate.latency_max_regression={perf/e2e_ms_p99:null,perf/e2e_ms_p90:0.1}"
        engine.server.python=python3 "+engine.server.env.PYTHONPATH=$VSITE"
        "+engine.server.env.VLLM_USE_FLASHINFER_SAMPLER='0'" engine.server.startup_timeout_s=480
        replay.progress=false tracking.system_metrics=false
        "tracking.uri=sqlite:///$STATE/mlflow/mlflow.db" ${FROM:+ladder.resume_from=$FROM} ${EXTRA:-})
fi
if [ -n "${SMOKE:-}" ]; then  # here, on the CPU: the same A/B, small
  ARGS=(+ab=engine_vllm model=tiny workload=azure_conv workload.num_requests=6 workload.sampling=head
        workload.time_scale=20 engine.max_model_len=1024 engine.kv_cache_gb=0.05 engine.cpu_threads=1
        replay.driver=locust "+opt=[paged_kv,dynamic_batching]" quality.num_prompts=4 quality.max_new_tokens=8
        replay.progress=false tracking.system_metrics=false "tracking.uri=sqlite:///$STATE/mlflow/mlflow.db"
        ${EXTRA:-})
fi
set +f

log() { echo "[gpu_ab_vllm $SECONDS s] $*"; }

# Stage folders on the machine: vLLM's chunks /tmp/vstage (assemble.sh), the serve wheels' /tmp/serve-stage, ours
# /tmp/wheelhouse-stage (deploy/install.py); each manifest is kept in a folder of its own (/tmp/vassemble,
# /tmp/serve-src, /tmp/wheelhouse-src): neither tool may be pointed at the folder it stages into.
stage() {  # copies the chunks and manifests this call brought into /tmp
  if [ -d .vllm-gpu ]; then
    if ls -d .vllm-gpu/c[0-9]* >/dev/null 2>&1; then bash .vllm-gpu/assemble.sh stage || exit 1; fi
    mkdir -p /tmp/vassemble /tmp/vstage
    [ -f .vllm-gpu/assemble.sh ] && cp .vllm-gpu/assemble.sh /tmp/vassemble/
    [ -f .vllm-gpu/manifest.tsv ] && cp .vllm-gpu/manifest.tsv /tmp/vstage/
  fi
  if [ -d .vllm-serve-wheels ]; then
    $PY deploy/install.py --from .vllm-serve-wheels --stage --stage-dir /tmp/serve-stage || exit 1
    mkdir -p /tmp/serve-src && cp .vllm-serve-wheels/manifest.tsv /tmp/serve-src/
  fi
  if ls -d wheelhouse/c[0-9]* >/dev/null 2>&1; then
    $PY deploy/install.py --from wheelhouse --stage || exit 1
    mkdir -p /tmp/wheelhouse-src && cp wheelhouse/manifest.tsv /tmp/wheelhouse-src/
  fi
  if [ -d .stage/mei ]; then mkdir -p /tmp/mei && cp .stage/mei/*.whl /tmp/mei/; fi
  if [ -d .gpu-data ]; then mkdir -p /tmp/gpu-data && cp -r .gpu-data/. /tmp/gpu-data/; fi
  if [ "$JOB" = ladder ]; then SMOLLM2_STAGE_ONLY=1 source benchmarks/gpu_smollm2.sh > /dev/null || exit 1; fi
}

complete() {  # complete MANIFEST STAGE_DIR: the manifest came (in this call or an earlier one), every part staged
  local p
  [ -f "$1" ] || return 1
  for p in $(cut -f4 "$1" | tr ',' ' '); do [ -f "$2/$p" ] || return 1; done
}

install() {  # whatever is complete and not installed yet, in order: vLLM, the serve wheels, ours
  if [ ! -d "$VSITE/vllm" ] && [ -f /tmp/vassemble/assemble.sh ] && complete /tmp/vstage/manifest.tsv /tmp/vstage; then
    log "installing vLLM into $VSITE"
    VSITE=$VSITE bash /tmp/vassemble/assemble.sh install > "$STATE/logs/install_vllm.log" 2>&1 \
      || { tail -20 "$STATE/logs/install_vllm.log"; exit 1; }
    grep '^ASSEMBLE-\(INSTALLED\|IMPORTS\|NOTE\|OK\)' "$STATE/logs/install_vllm.log"
  fi
  if [ -d "$VSITE/vllm" ] && [ ! -f "$VSITE/.serve-wheels-installed" ] \
      && complete /tmp/serve-src/manifest.tsv /tmp/serve-stage; then
    log "installing the serve wheels into $VSITE"
    # its pip check (PYTHONPATH=$VSITE: bundle + serve wheels + image) names what none of them meets: logged, not
    # fatal (the import check below decides)
    PYTHONPATH=$VSITE $PY deploy/install.py --from /tmp/serve-src --stage-dir /tmp/serve-stage --target "$VSITE" \
      > "$STATE/logs/install_serve.log" 2>&1
    tail -5 "$STATE/logs/install_serve.log"
    [ -d "$VSITE/uvicorn" ] || exit 1
    # what `vllm serve` imports before it loads a model: its CLI and the OpenAI server (no GPU work)
    PYTHONPATH=$VSITE timeout 300 $PY -c "import vllm, vllm.entrypoints.cli.main, vllm.entrypoints.openai.api_server
print('vllm', vllm.__version__, 'serve imports OK')" > "$STATE/logs/serve_imports.log" 2>&1
    local rc=$?
    tail -3 "$STATE/logs/serve_imports.log"
    [ "$rc" = 0 ] || { tail -40 "$STATE/logs/serve_imports.log"; exit 1; }
    touch "$VSITE/.serve-wheels-installed"
  fi
  if [ ! -d "$OSITE/hydra" ] && complete /tmp/wheelhouse-src/manifest.tsv /tmp/wheelhouse-stage; then
    log "installing the project's wheelhouse into $OSITE"
    $PY deploy/install.py --from /tmp/wheelhouse-src --target "$OSITE" > "$STATE/logs/install_ours.log" 2>&1 \
      || { tail -20 "$STATE/logs/install_ours.log"; exit 1; }
  fi
  if [ -d "$OSITE/hydra" ] && [ ! -d "$OSITE/mlflow_export_import" ] && ls /tmp/mei/*.whl >/dev/null 2>&1; then
    # mlflow-export-import without its dependencies: mlflow-skinny, pandas and tabulate are there
    $PY -m pip install -q --no-index --no-deps --target "$OSITE" /tmp/mei/*.whl || exit 1
  fi
}

versions() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$STATE/logs/versions.txt"
  PYTHONPATH=$OSITE $PY -c "import sys, torch, transformers, hydra, mlflow; print('python', sys.version.split()[0],
  'torch', torch.__version__, 'transformers', transformers.__version__, 'hydra', hydra.__version__, 'mlflow',
  mlflow.__version__)" | tee -a "$STATE/logs/versions.txt"
  PYTHONPATH=$VSITE $PY -c "import vllm, fastapi, uvicorn, pydantic; print('vllm', vllm.__version__, 'fastapi',
  fastapi.__version__, 'uvicorn', uvicorn.__version__, 'pydantic', pydantic.__version__)" \
    | tee -a "$STATE/logs/versions.txt"
}

check() {  # both arms composed as run.py composes them, refused settings found, vLLM's command line printed
  $PY - "${ARGS[@]}" <<'PY'
import sys
from pathlib import Path
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from optladder.experiments.schema import register
from optladder.experiments.ab_run import base_overrides, compose_arm
from optladder.experiments.build import build
from optladder.backends.vllm_args import build_launch
from optladder.backends.vllm_model import model_folder
from optladder.engine.validation import validate_engine

register()
args = sys.argv[1:]
with initialize_config_dir(config_dir=str(Path("optladder/conf").resolve()), version_base="1.3"):
    top = compose(config_name="config", overrides=args)
    base = base_overrides(args)
    if top.get("ab") is not None:
        arms = [("control", list(top.ab.control)), ("candidate", list(top.ab.candidate))]
    else:  # a ladder: its baseline and each rung with the opts up to it, as run_ladder composes them
        rungs = list(top.ladder.rungs)
        arms = [("baseline", [])] + [(r, [f"+opt=[{','.join(rungs[:i + 1])}]"]) for i, r in enumerate(rungs)]
    for name, extra in arms:
        conf = build(compose_arm(base, extra))
        e = conf.engine
        print(f"{name}: engine={e.name} opts paged_kv={e.paged_kv} flash_attn={e.flash_attn} "
              f"dynamic_batching={e.dynamic_batching} chunked_prefill={e.chunked_prefill} "
              f"batched_decode={e.batched_decode} cuda_graphs={e.cuda_graphs} piecewise_graphs={e.piecewise_graphs} "
              f"fused_kernels={e.fused_kernels} max_model_len={e.max_model_len} "
              f"kv_cache_gb={e.kv_cache_gb} max_num_seqs={e.max_num_seqs} max_num_batched_tokens="
              f"{e.max_num_batched_tokens} block_size={e.block_size} dtype={e.dtype} driver={conf.replay.driver}")
        if e.name == "reference":
            validate_engine(e, "cuda")
        if e.name == "vllm":
            path, margs = model_folder(conf.model)  # writes <cache>/<model>-vllm
            launch = build_launch(e, "cuda", path, e.server.served_model_name or conf.model.name, e.server.host,
                                  8000, margs)
            print(f"  vllm serve ({e.server.python}):", " ".join(launch.args))
            print("  server env added:", launch.env)
            print("  model folder:", path, sorted(p.name for p in path.iterdir()))
PY
}

# the detached A/B or ladder: run.py in its own process session, so it outlives this call (AB_S at most)
detached() {
  local envs=(PYTHONPATH="$RUNPATH")
  [ -n "${SMOKE:-}" ] && envs=()  # here: this checkout's environment
  detach "$STATE" "$STATE/logs/run.log" timeout -s TERM -k 40 "${AB_S:-1500}" env ${envs[@]+"${envs[@]}"} \
    OPTLADDER_DATA="$OPTLADDER_DATA" OPTLADDER_CACHE="$OPTLADDER_CACHE" PYTHONUNBUFFERED=1 \
    $PY run.py "${ARGS[@]}" hydra.run.dir="$STATE/run"
  log "the $JOB runs detached (at most ${AB_S:-1500}s): $STATE/run.sh"
}

RC=0
poll() {  # until the detached A/B ends, or WAIT_S from this script's start; RC 124 while it still runs
  if wait_rc "$STATE" "$WAIT_S"; then RC=$(cat "$STATE/rc")
  else RC=124; log "still running: call '$0 wait' at once"; fi
  tail -30 "$STATE/logs/run.log" 2>/dev/null
}

pack() {  # the runs exported, the state packed into $OUT (at most 8 files of at most 16 MiB come back)
  if [ -f "$STATE/mlflow/mlflow.db" ]; then
    local pp=$OSITE
    [ -n "${SMOKE:-}" ] && pp=${PYTHONPATH:-}
    PYTHONPATH=$pp timeout 120 $PY -m optladder.experiments.runs_transfer export \
      --uri "sqlite:///$STATE/mlflow/mlflow.db" --out "$STATE/mlflow-export-new" > "$STATE/logs/export.log" 2>&1 \
      && rm -rf "$STATE/mlflow-export" && mv "$STATE/mlflow-export-new" "$STATE/mlflow-export"
  fi
  # the vLLM server logs (optladder/backends/vllm_server.py writes them under /tmp/optladder-vllm-*)
  mkdir -p "$STATE/vllm-logs" && cp /tmp/optladder-vllm-*/vllm-*.log "$STATE/vllm-logs/" 2>/dev/null
  rm -f "$OUT"/"$JOB"-vllm-*.tgz*
  tar czf "$OUT/$JOB-vllm-$MODE.tgz" -C "$STATE" --exclude=./cache --exclude=./mlflow-export-new .
  split_archive "$OUT/$JOB-vllm-$MODE.tgz"  # here: cat $JOB-vllm-*.tgz.part* | tar xz
  for f in verdict.json ladder.json; do [ -f "$STATE/run/$f" ] && cp "$STATE/run/$f" "$OUT/"; done
  cp "$STATE/logs/run.log" "$OUT/" 2>/dev/null
  ls -la "$OUT"
}

if [ "$MODE" = check ]; then check; exit $?; fi
if [ -z "${SMOKE:-}" ]; then stage; install; fi
if [ "$MODE" = stage ]; then
  log "staged: $(ls -d /tmp/vstage/c* /tmp/serve-stage/c* /tmp/wheelhouse-stage/c* 2>/dev/null | tr '\n' ' ')"
  log "installed: vllm=$([ -d "$VSITE/vllm" ] && echo yes || echo no) serve-wheels=$([ -f \
    "$VSITE/.serve-wheels-installed" ] && echo yes || echo no) ours=$([ -d "$OSITE/hydra" ] && echo yes || echo no)"
  exit 0
fi
if [ "$MODE" = start ]; then
  if [ -f "$STATE/run.sh" ] && [ ! -f "$STATE/rc" ]; then
    echo "a $JOB still runs in $STATE: '$0 wait' for it"; exit 2
  fi
  if [ -z "${SMOKE:-}" ]; then
    for need in "$VSITE/vllm" "$VSITE/.serve-wheels-installed" "$OSITE/hydra" "$OPTLADDER_DATA/traces"; do
      [ -e "$need" ] || { echo "not installed: $need (a call missed its chunks, or the machine went cold):" \
        "see the header"; exit 2; }
    done
    versions
    if [ "$JOB" = ladder ]; then  # SmolLM2's GGUF joined from the pieces the calls brought (gpu_smollm2.sh)
      source benchmarks/gpu_smollm2.sh
      [ ${#SMOL[@]} -gt 0 ] || { echo "SmolLM2's pieces are not all here: see gpu_vllm_ladder.sh"; exit 2; }
      RUNPATH=$OSITE:/tmp/stage/pkg:/tmp/site-gguf  # what gpu_smollm2.sh put on PYTHONPATH
    fi
    PYTHONPATH=$RUNPATH check > "$STATE/logs/check.log" 2>&1 || { cat "$STATE/logs/check.log"; exit 3; }
    cat "$STATE/logs/check.log"
  fi
  rm -rf "$STATE/run" "$STATE/mlflow" "$STATE/mlflow-export" "$STATE/rc" "$STATE/vllm-logs" /tmp/optladder-vllm-*
  mkdir -p "$STATE/mlflow"
  detached
  poll
else  # wait
  [ -f "$STATE/run.sh" ] || { echo "no detached A/B on this machine ($STATE/run.sh): '$0 start' first"; exit 2; }
  poll
fi
pack
exit "$RC"
