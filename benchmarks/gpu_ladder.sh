#!/usr/bin/env bash
# The main job on the H200, through run.py only: the GPU ladder (Llama-3-8B's shape, random bf16
# weights: exact agreement with the control decides quality) over the first 500 requests of the Azure
# conversation trace at its own timestamps, every rung gated against the one before, tracked in MLflow.
# Two device calls of at most 10 minutes on one warm machine: the first installs the wheelhouse and runs the
# ladder until its time is up (run.py ends the rung in progress as KILLED and keeps every finished one); the
# second resumes it (`ladder.resume_from`: finished rungs are read back, the rest run). /tmp survives between
# calls while the machine stays warm (~30 s idle), so the ladder directory and the MLflow store live there and
# each call packs them into $OUT.
# Here, once:
#   python deploy/wheelhouse.py --out wheelhouse --extras '' --no-vllm-serve     # 66 wheels, 34.4 MiB: one chunk
#   mkdir -p .gpu-data && cp -r ../shared/data/traces ../shared/data/prompts .gpu-data/
#   pip download --no-deps -d .stage/mei mlflow-export-import==1.2.0   # the runs' way home (pure Python, 0.1 MiB)
# Device calls (kind nvidia-h200), back to back:
#   1  bash benchmarks/gpu_ladder.sh first    carry: wheelhouse .gpu-data .stage/mei
#   2  bash benchmarks/gpu_ladder.sh resume   carry: .gpu-data
# If the machine went back between the calls: unpack call 1's ladder-first.tgz into .stage/ladder-state here and
#   2' FROM=.stage/ladder-state bash benchmarks/gpu_ladder.sh resume   carry: wheelhouse .gpu-data .stage/ladder-state
# Each call ends by exporting the MLflow runs so far (optladder/experiments/runs_transfer.py) and packing the newest run
# directory, the MLflow store (with its artifacts), the export and the logs into
# $OUT/ladder-<mode>.tgz; here, after `tar xzf` of the last one, the runs join this tracking store with
# `make import-runs FROM=<unpacked>/mlflow-export` (again after a later call: runs already there are skipped).
# Settings (environment): TS, the trace's time scale (1 = its own timestamps; 2 = half its rate); N, the
# requests from the trace's head (500); RUNGS; BASELINE, overrides of the baseline's engine (its static
# batch); EXTRA, more overrides; DEADLINE_S, seconds from the start by which a call has packed its results
# (570; the ladder gets what is left less 90 s; SIGKILL 40 s after SIGTERM). Exit status: the ladder's (124:
# cut at the deadline, resume it). Measured (benchmarks/results/gpu_ladder_h200): the baseline does not keep
# up at TS=0.5 (N=500) nor at TS=2.5 (N=80), and a rung of N=80 at TS=2.5 takes ~2 minutes.
# A rung longer than a call (500 requests at TS=4: an 8.6-minute replay) runs detached instead: `start` launches
# the whole ladder in its own process session (it outlives the call, for LADDER_S at most: a machine is held 30
# minutes) and returns WAIT_S after the script started (DEADLINE_S less 90 s: 480) with what is done so far;
# `wait`, called at once on the same warm machine (~30 s idle), polls again and packs again, until the ladder
# ends (exit status 124 while it runs). The runs exported while the ladder still writes its store are a
# snapshot: the last call's export, after the ladder ended, is the one to import.
#   1  bash benchmarks/gpu_ladder.sh start   carry: wheelhouse .gpu-data .stage/mei
#   2… bash benchmarks/gpu_ladder.sh wait                carry: nothing more
# STOP_AFTER=K (given to start and wait) ends the ladder once rung K is judged, so a session's device time is not
# spent on a rung that cannot finish within it (exit status 143 then: run.py ended by SIGTERM; K below the last
# rung: at the last one the ladder ends by itself). Keep STATE (/tmp/optladder-ladder) the same across machines:
# the MLflow store records its artifacts' absolute paths.
# A later session (a fresh machine) resumes it detached from the last call's archive (FROM: a ladder-*.tgz, or a
# folder it was unpacked into; an archive committed under benchmarks/results/ travels with the repository, no
# carry needed; the 8B ladder's went that way until its last rung, 18 MB of each call's 64 MiB):
#   FROM=<a ladder-*.tgz or its folder> TS=4 N=500 bash benchmarks/gpu_ladder.sh start
# (carry: wheelhouse .gpu-data .stage/mei), then `wait` calls as above. TS, N, RUNGS, BASELINE and EXTRA must be those
# the archive ran with (refused otherwise); an archive split into FROM.part00, .part01, ... is joined.
# MODEL=smollm2 runs the same ladder on real weights (SmolLM2-135M-Instruct in bf16: BLEU and ROUGE against the
# references and the control decide quality). Its 98 MB GGUF file travels in two pieces (`bash
# benchmarks/stage_smollm2.sh` here makes .stage/a, .stage/b and .stage/c, ~33 MB each), so four calls start it:
#   1  bash benchmarks/gpu_ladder.sh stage          carry: wheelhouse .stage/mei   (installs into /tmp)
#   2  bash benchmarks/gpu_ladder.sh stage          carry: .stage/a                (the first piece into /tmp/stage)
#   3  bash benchmarks/gpu_ladder.sh stage          carry: .stage/b                (the second piece, its sha256, gguf)
#   4  OPTLADDER_DATA=$PWD/.gpu-data-slim MODEL=smollm2 TS=.. N=.. bash benchmarks/gpu_ladder.sh start
#                                                   carry: .stage/c .gpu-data-slim (or .gpu-data, no OPTLADDER_DATA)
# then `MODEL=smollm2 bash benchmarks/gpu_ladder.sh wait` calls. (A call carries at most 64 MiB with the tree's
# ~17 MiB, by the device tool's count, which is larger than the file bytes: it refused a half of an older two-piece
# staging, 47 MiB, with the tree and the data at 63.6 MiB of file bytes.)
# AFTER=DIR (start): the detached ladder waits for DIR/rc, another detached ladder's exit status, before it starts
# (gpu_ladder_pair.sh ONE_GPU=1: two ladders one after the other on one GPU).
# SMOKE=1 runs the same steps on the tiny model with this checkout's environment (the CPU check of the script).
set -uo pipefail
[ -n "${FROM:-}" ] && FROM=$(realpath -m "$FROM")  # relative to where the command was given
[ -n "${AFTER:-}" ] && AFTER=$(realpath -m "$AFTER")
for v in AFTER_START_S AFTER_MAX_S; do  # whole seconds, or the waiter's test never holds
  case "${!v:-0}" in *[!0-9]*) echo "$v=${!v}: whole seconds, e.g. 300"; exit 2 ;; esac
done
cd "$(dirname "$0")/.."
source benchmarks/gpu_detached.sh  # detach, wait_rc, split_archive
OUT=${OUT:-$PWD/gpu_out}
MODE=${1:-first}
PY=${PY:-python3}
TS=${TS:-1}
N=${N:-500}
RUNGS=${RUNGS:-"[paged_kv,flash_attn,dynamic_batching,chunked_prefill,batched_decode,cuda_graphs]"}
BASELINE=${BASELINE:-"engine.batch_size=64 engine.batch_timeout_ms=50"}
DEADLINE_S=${DEADLINE_S:-570}  # seconds from this script's start by which everything is packed (a call: 600)
STATE=${STATE:-/tmp/optladder-ladder}
case "$MODE" in first|resume|start|wait|stage) ;; *) echo "usage: $0 first|resume|start|wait|stage"; exit 2 ;; esac
MODEL=${MODEL:-8b}
case "$MODEL" in
  8b) MODEL_ARGS=(model=llama3_8b_shape) ;;
  smollm2) MODEL_ARGS=(model=smollm2_135m engine.dtype=bfloat16) ;;
  *) echo "MODEL=$MODEL: one of 8b (llama3_8b_shape, random bf16 weights), smollm2 (SmolLM2-135M-Instruct in bf16)"; exit 2 ;;
esac
if [ "$MODE" = start ] && [ -f "$STATE/run.sh" ] && [ ! -f "$STATE/rc" ]; then
  echo "a detached ladder still runs in $STATE: '$0 wait' for it"; exit 2
fi
# FROM: an archive (or its 15 MiB pieces FROM.part00, FROM.part01, ...) or a folder; checked before anything is removed
if [ -n "${FROM:-}" ] && [ ! -e "$FROM" ] && [ ! -e "$FROM.part00" ]; then
  echo "FROM=$FROM: no such archive, pieces ($FROM.part00 ...) or folder"; exit 2
fi
# a fresh ladder: nothing of an earlier one on this machine is reused
{ [ "$MODE" = first ] || [ "$MODE" = start ]; } && rm -rf "$STATE"
# resume on a fresh machine: FROM, a folder carried along holding an earlier call's unpacked ladder-*.tgz
# (`start` with FROM resumes that ladder detached)
# (only onto a machine without a ladder store yet: a second `resume` on the same machine goes on from its own state)
if { [ "$MODE" = resume ] || [ "$MODE" = start ]; } && [ -n "${FROM:-}" ] && [ ! -f "$STATE/mlflow/mlflow.db" ]; then
  mkdir -p "$STATE"
  if [ -f "$FROM" ]; then tar xzf "$FROM" -C "$STATE" || { echo "FROM=$FROM: not a readable ladder-*.tgz"; exit 2; }
  elif [ -f "$FROM.part00" ]; then
    cat "$FROM".part* | tar xz -C "$STATE" || { echo "FROM=$FROM.part*: not the pieces of a ladder-*.tgz"; exit 2; }
  elif [ -d "$FROM" ]; then cp -r "$FROM"/. "$STATE"/
  else echo "FROM=$FROM is neither an earlier call's ladder-*.tgz nor a folder it was unpacked into"; exit 2; fi
  rm -f "$STATE/run.sh" "$STATE/rc" "$STATE/rc.tmp" "$STATE/detached-name" "$STATE/stop-sent"
fi
mkdir -p "$OUT" "$STATE/logs"
export PYTHONUNBUFFERED=1 OPTLADDER_DATA=${OPTLADDER_DATA:-$PWD/.gpu-data}
set -f  # BASELINE and EXTRA are split into overrides, never expanded as file patterns ([a,b] is one)
ARGS=(+ladder=gpu "ladder.rungs=$RUNGS" "${MODEL_ARGS[@]}" workload=azure_conv workload.num_requests="$N"
      workload.sampling=head workload.time_scale="$TS" engine.max_model_len=4096 engine.kv_cache_gb=60
      engine.max_num_seqs=256 $BASELINE replay.progress=false tracking.system_metrics=false
      "tracking.uri=sqlite:///$STATE/mlflow/mlflow.db" ${EXTRA:-})
if [ -n "${SMOKE:-}" ]; then  # here, on the CPU: the same steps, small
  SMOKE_MODEL=model=tiny; [ "$MODEL" = smollm2 ] && SMOKE_MODEL=model=smollm2_135m  # float32 on the CPU
  ARGS=(+ladder=gpu "ladder.rungs=[paged_kv,dynamic_batching]" $SMOKE_MODEL workload=azure_conv
        workload.num_requests=6 workload.sampling=head workload.time_scale=20 engine.max_model_len=1024
        engine.kv_cache_gb=0.05 engine.cpu_threads=1 quality.num_prompts=4 quality.max_new_tokens=8
        replay.progress=false tracking.system_metrics=false "tracking.uri=sqlite:///$STATE/mlflow/mlflow.db"
        ${EXTRA:-})
fi
set +f

install() {
  [ -n "${SMOKE:-}" ] && return 0
  if [ ! -d /tmp/site-optladder/hydra ]; then
    $PY deploy/install.py --from wheelhouse --target /tmp/site-optladder > "$STATE/logs/install.log" 2>&1 \
      || { tail -20 "$STATE/logs/install.log"; exit 1; }
    # mlflow-export-import without its dependencies: mlflow-skinny, pandas and tabulate are there
    $PY -m pip install -q --no-index --no-deps --target /tmp/site-optladder .stage/mei/*.whl || exit 1
  fi
  export PYTHONPATH=/tmp/site-optladder
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$STATE/logs/versions.txt"
  $PY -c "import sys, torch, transformers, hydra, mlflow; print('python', sys.version.split()[0], 'torch',
  torch.__version__, 'transformers', transformers.__version__, 'hydra', hydra.__version__, 'mlflow',
  mlflow.__version__)" | tee -a "$STATE/logs/versions.txt"
}

RC=0
ladder() {  # ladder NAME [overrides]: run.py until 90 s before DEADLINE_S, then SIGTERM (the rung in progress
  local name=$1; shift                                                            # ends KILLED, the rest stays)
  local budget=$((DEADLINE_S - SECONDS - 90))
  [ "$budget" -gt 30 ] || { echo "only ${budget}s left before the deadline: not started"; RC=3; return; }
  local t0=$SECONDS
  timeout -s TERM -k 40 "$budget" $PY run.py "${ARGS[@]}" "$@" hydra.run.dir="$STATE/$name" \
    > "$STATE/logs/$name.log" 2>&1
  RC=$?
  printf '%s\t%s\t%s\n' "$name" "$((SECONDS - t0))" "$RC" | tee -a "$STATE/logs/times.tsv"
  tail -25 "$STATE/logs/$name.log"
}

runs() {  # the run directories under $STATE, oldest first (first, resume0, resume1, ..., resume10)
  [ -d "$STATE/first" ] && echo "$STATE/first"
  ls -d "$STATE"/resume*/ 2>/dev/null | sed 's:/$::' | awk -F'resume' '{print $NF "\t" $0}' | sort -n | cut -f2
}
latest() {  # the newest run directory under $STATE that holds rungs (empty if none)
  local d last=
  for d in $(runs); do ls -d "$d"/rung* >/dev/null 2>&1 && last=$d; done
  echo "$last"
}
next_resume() {  # the name of the next resume's run directory: one past the highest
  local hi
  hi=$(runs | sed -n 's:.*/resume\([0-9]*\)$:\1:p' | tail -1)
  echo "resume$(( ${hi:--1} + 1 ))"
}
detached() {  # start: the whole ladder in its own process session, for LADDER_S at most; poll until WAIT_S
  local budget=${LADDER_S:-1560} after=()
  # AFTER=DIR: the ladder starts once DIR/rc exists (another detached ladder on the same GPU has ended); its
  # LADDER_S counts from then
  # (given up, exit status 3, when no ladder has started there within AFTER_START_S, 300, or none ended within
  # AFTER_MAX_S, 3600)
  [ -n "${AFTER:-}" ] && after=(bash -c 'waited=0
    while [ ! -f "$0/rc" ]; do
      if [ ! -f "$0/run.sh" ] && [ "$waited" -ge "$1" ]; then echo "AFTER=$0: no ladder started there in ${1}s"; exit 3; fi
      if [ "$waited" -ge "$2" ]; then echo "AFTER=$0: the ladder there did not end in ${2}s"; exit 3; fi
      sleep 2; waited=$((waited + 2))
    done
    shift 2; exec "$@"' "$AFTER" "${AFTER_START_S:-300}" "${AFTER_MAX_S:-3600}")
  detach "$STATE" "$STATE/logs/$name.log" ${after[@]+"${after[@]}"} timeout -s TERM -k 40 "$budget" \
    env PYTHONPATH="${PYTHONPATH:-}" \
    OPTLADDER_DATA="$OPTLADDER_DATA" ${OPTLADDER_CACHE:+OPTLADDER_CACHE="$OPTLADDER_CACHE"} PYTHONUNBUFFERED=1 \
    $PY run.py "${ARGS[@]}" "$@" hydra.run.dir="$STATE/$name"
  echo "$name" > "$STATE/detached-name"
  echo "the ladder runs detached (at most ${budget}s): $STATE/run.sh"
}
stop_after() {  # STOP_AFTER=K: end the ladder once rung K is judged (the next session resumes from there)
  if [ -n "${STOP_AFTER:-}" ] && grep -q "^rung $STOP_AFTER (" "$STATE/logs/$name.log" 2>/dev/null \
      && [ ! -f "$STATE/stop-sent" ]; then
    sleep 3; echo "rung $STOP_AFTER judged: stopping the ladder (STOP_AFTER=$STOP_AFTER)"
    # run.py itself (not its `timeout` wrapper, which would pass a second TERM on), this ladder's only
    touch "$STATE/stop-sent"; pkill -TERM -f "^[^ ]*python[^ ]* run.py [+]ladder=gpu .*hydra.run.dir=$STATE/"
  fi
}
poll() {  # until the detached ladder ends, or WAIT_S from this script's start (packing needs what is left of
  # DEADLINE_S); RC 124 while it still runs
  if wait_rc "$STATE" "${WAIT_S:-$((DEADLINE_S - 90))}" stop_after; then RC=$(cat "$STATE/rc")
  else RC=124; echo "still running: call '$0 wait' at once"; fi
  tail -25 "$STATE/logs/$name.log"
}

install
if [ "$MODE" = stage ]; then  # an earlier call on the same warm machine: install (above), then the GGUF pieces carried
  SMOLLM2_STAGE_ONLY=1 source benchmarks/gpu_smollm2.sh || exit 1
  exit 0
fi
if [ "$MODEL" = smollm2 ] && [ -z "${SMOKE:-}" ] && [ "$MODE" != wait ]; then
  source benchmarks/gpu_smollm2.sh  # stages the pieces carried, joins those in /tmp/stage, checks the sha256
  [ ${#SMOL[@]} -gt 0 ] || { echo "MODEL=smollm2 needs the GGUF pieces: see this script's header"; exit 2; }
  export OPTLADDER_CACHE=${OPTLADDER_CACHE:-/tmp/stage/cache}  # converted once per machine (per copy: gpu_ladder_pair.sh)
fi
if [ "$MODE" = start ]; then
  last=$(latest)
  if [ -n "${FROM:-}" ]; then
    [ -n "$last" ] || { echo "FROM=$FROM holds no ladder with rungs"; exit 2; }
    # the same settings or nothing is resumed (a rung run under other settings is run again, from rung 0)
    if [ -f "$last/.hydra/overrides.yaml" ] && ! diff <(sed -n 's/^- //p' "$last/.hydra/overrides.yaml" \
        | grep -v '^ladder.resume_from=\|^tracking.uri=' | sort) <(printf '%s\n' "${ARGS[@]}" | grep -v '^tracking.uri=' \
        | sort) > "$STATE/logs/settings.diff"; then
      echo "FROM=$FROM ran with other settings than this call (TS, N, RUNGS, BASELINE, EXTRA); '<' its, '>' this call's:"
      cat "$STATE/logs/settings.diff"; exit 2
    fi
    name=$(next_resume)
    detached ladder.resume_from="$last"
  else
    name=first
    detached
  fi
  poll
elif [ "$MODE" = wait ]; then
  [ -f "$STATE/run.sh" ] || { echo "no detached ladder on this machine ($STATE/run.sh): '$0 start' first"; exit 2; }
  name=$(cat "$STATE/detached-name" 2>/dev/null || echo first)
  poll
elif [ "$MODE" = first ]; then
  name=first
  ladder first
else
  # from the newest run directory that holds rungs: every rung that finished there is read back, not run again
  last=$(latest)
  [ -n "$last" ] || { echo "no earlier ladder with rungs under $STATE: run '$0 first' on this machine first"; exit 2; }
  name=$(next_resume)
  ladder "$name" ladder.resume_from="$last"
fi
$PY -m optladder.experiments.runs_transfer export --uri "sqlite:///$STATE/mlflow/mlflow.db" --out "$STATE/mlflow-export-new" \
  && rm -rf "$STATE/mlflow-export" && mv "$STATE/mlflow-export-new" "$STATE/mlflow-export"
# what comes back is at most 8 files of at most 16 MiB: one archive (the run directories, the exported runs, the
# logs, the store), in 15 MiB pieces if larger, and this call's ladder report
# the MLflow store travels whole (its artifacts too: a resumed ladder's export must still find the earlier runs'
# files); an older run directory is left out once every rung that finished there is finished in the newest one
# (a resume copies them there)
keep=$(latest); EXCL=()
for d in $(runs); do
  [ "$d" = "$keep" ] && continue
  all=1
  for f in "$d"/rung*/summary.json; do
    [ -f "$f" ] || continue
    [ -f "$keep/$(basename "$(dirname "$f")")/summary.json" ] || all=0
  done
  [ -n "$keep" ] && [ "$all" = 1 ] && EXCL+=(--exclude="./$(basename "$d")")
done
tar czf "$OUT/ladder-$MODE.tgz" -C "$STATE" ${EXCL[@]+"${EXCL[@]}"} --exclude=./mlflow-export-new .
split_archive "$OUT/ladder-$MODE.tgz"  # join here: cat ladder-*.tgz.part* | tar xz
for f in ladder.md ladder.json ladder.png; do [ -f "$STATE/$name/$f" ] && cp "$STATE/$name/$f" "$OUT/"; done
ls -la "$OUT"
exit "$RC"
