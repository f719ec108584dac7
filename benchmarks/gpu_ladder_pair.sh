#!/usr/bin/env bash
# Does the GPU ladder reproduce? Two copies of the same ladder at once on a two-GPU host (kind nvidia-h200-x2), each
# from its own copy of this checkout, on its own GPU, with its own ladder directory, MLflow store and converted
# model: two independent runs in one session's device time, then optladder/experiments/ladder_compare.py on the two (the same
# settings, the same verdict at every rung, each headline metric within noise). Both copies share the host's CPUs,
# so this says what two runs of the README's commands give on one machine; a run in another session, on another
# machine, compares the same way (`python -m optladder.experiments.ladder_compare A B` here).
# Device calls (kind nvidia-h200-x2), back to back on one warm machine, as for benchmarks/gpu_ladder.sh:
#   1  bash benchmarks/gpu_ladder.sh stage                  carry: wheelhouse .stage/mei   (installs into /tmp)
#   2  bash benchmarks/gpu_ladder.sh stage                  carry: .stage/a
#   3  bash benchmarks/gpu_ladder.sh stage                  carry: .stage/b
#   4  OPTLADDER_DATA=$PWD/.gpu-data-slim MODEL=smollm2 TS=.. N=.. LADDER_S=.. bash benchmarks/gpu_ladder_pair.sh start
#                                                           carry: .stage/c .gpu-data-slim
#   5… MODEL=smollm2 bash benchmarks/gpu_ladder_pair.sh wait     (exit status 124 while either still runs)
# Every setting of gpu_ladder.sh (MODEL, TS, N, RUNGS, BASELINE, EXTRA, LADDER_S, STOP_AFTER) is passed to both.
# Each copy runs pinned to its half of the host's cores (taskset, where there): the eager rungs are host-bound, and
# half of an nvidia-h200-x2 host's 32 cores is what an nvidia-h200 machine has. The copies leave .stage out and read
# the GGUF pieces from /tmp/stage: a piece carried with `start` is copied there first.
# What comes back (at most 8 files: room for a split archive): $OUT/a/ladder-<mode>.tgz and $OUT/b/ladder-<mode>.tgz
# (each a gpu_ladder.sh archive, in 15 MiB pieces if larger), $OUT/calls.log (both copies' output), $OUT/status.txt
# (each copy's exit status, and the comparison's once both ended) and then $OUT/compare.md (the comparison).
# Exit status: 124 while either copy still runs, else 0 when both ended with 0, else the first other status.
# ONE_GPU=1 (kind nvidia-h200, one GPU): the same two copies one after the other on GPU 0, each with all the cores:
# copy b's ladder starts once copy a's has ended (gpu_ladder.sh's AFTER), so one session's device time holds both
# when a ladder takes less than half of it; the calls are the same, `wait` until both ended.
set -uo pipefail
MODE=${1:-}
case "$MODE" in start|wait) ;; *) echo "usage: $0 start|wait (a pair of detached ladders, GPUs 0 and 1)"; exit 2 ;; esac
for v in OUT COPIES OPTLADDER_DATA OPTLADDER_CACHE; do  # relative to where the command was given (copies run elsewhere)
  [ -n "${!v:-}" ] && export "$v=$(realpath -m "${!v}")"
done
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
COPIES=${COPIES:-/tmp}  # the copies: $COPIES/copy-a, copy-b; their ladders: $COPIES/optladder-ladder-a, -b
ROOT=$PWD
PY=${PY:-python3}
case "${ONE_GPU:-}" in ""|0) ONE_GPU= ;; *) ONE_GPU=1 ;; esac  # ONE_GPU=0 is the two-GPU mode
# `start` records the mode, so a `wait` without ONE_GPU=1 still knows it
[ "$MODE" = wait ] && [ -z "$ONE_GPU" ] && [ "$(cat "$COPIES/optladder-pair-mode" 2>/dev/null)" = one-gpu ] && ONE_GPU=1
gpu_of() { [ "$1" = b ] && [ -z "$ONE_GPU" ] && echo 1 || echo 0; }  # copy a on GPU 0, b on GPU 1 (ONE_GPU: 0)
running() { [ -f "$COPIES/optladder-ladder-$1/run.sh" ] && [ ! -f "$COPIES/optladder-ladder-$1/rc" ]; }
if [ "$MODE" = start ]; then
  for i in a b; do  # before anything is removed: a copy still running is not overwritten
    running "$i" && { echo "copy $i still runs ($COPIES/optladder-ladder-$i): '$0 wait' for it"; exit 2; }
  done
  n=$(nvidia-smi -L 2>/dev/null | wc -l)
  need=2; [ -n "$ONE_GPU" ] && need=1
  [ -n "${SMOKE:-}" ] || [ "$n" -ge "$need" ] \
    || { echo "$need GPU(s) needed (kind nvidia-h200-x2, or ONE_GPU=1 on one); nvidia-smi lists $n"; exit 2; }
  # the data beside the copies: a folder carried under the checkout is gone at the next call, and with ONE_GPU copy
  # b's ladder reads it then
  DATA_SRC=$(realpath -m "${OPTLADDER_DATA:-$ROOT/.gpu-data}")
  [ -d "$DATA_SRC" ] && [ "$DATA_SRC" != "$(realpath -m "$COPIES/optladder-data")" ] \
    || { echo "no data at $DATA_SRC: carry .gpu-data, or set OPTLADDER_DATA to the folder carried"; exit 2; }
  if [ "${MODEL:-8b}" = smollm2 ] && [ -z "${SMOKE:-}" ]; then  # joined once here: two copies at once would race
    source benchmarks/gpu_smollm2.sh  # a piece carried with this call goes to /tmp/stage, where the copies read it
    [ ${#SMOL[@]} -gt 0 ] || { echo "MODEL=smollm2 needs the GGUF pieces: see gpu_ladder.sh's header"; exit 2; }
  fi
  # checked: now an earlier pair's ladders go (copy b must not take copy a's old exit status for its start signal)
  rm -rf "$COPIES/optladder-ladder-a" "$COPIES/optladder-ladder-b" "$COPIES/optladder-data"
  mkdir -p "$COPIES" && { [ -n "$ONE_GPU" ] && echo one-gpu || echo two-gpu; } > "$COPIES/optladder-pair-mode"
  mkdir "$COPIES/optladder-data" && cp -rL "$DATA_SRC"/. "$COPIES/optladder-data"/ || exit 1
  for i in a b; do  # a copy of the checkout as it came: its files, no carried staging, no earlier outputs
    rm -rf "$COPIES/copy-$i" && mkdir -p "$COPIES/copy-$i"
    if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
      git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -
    else  # the device's copy of a working tree has no .git: its ignored paths are the carried ones and outputs
      tar cf - --exclude=./.git --exclude=./.stage --exclude=./wheelhouse --exclude='./.vllm*' --exclude=./gpu_out \
        --exclude=./outputs --exclude='./.gpu-data*' --exclude='./.venv*' --exclude=./.cache --exclude=./mlartifacts \
        --exclude=./mlflow.db .
    fi | tar xf - -C "$COPIES/copy-$i" || exit 1
  done
fi
cores=$(nproc)
pids=()
for i in a b; do
  [ -d "$COPIES/copy-$i" ] || { echo "no $COPIES/copy-$i: '$0 start' first on this machine"; exit 2; }
  gpu=$(gpu_of "$i")
  pin=() after=()  # copy a on the first half of the cores, b on the second (ONE_GPU: one at a time, all cores)
  [ -n "$ONE_GPU" ] && [ "$i" = b ] && after=(env AFTER="$COPIES/optladder-ladder-a")
  if [ -z "$ONE_GPU" ] && command -v taskset > /dev/null && [ "$cores" -ge 2 ]; then
    half=$((cores / 2)); lo=$((gpu * half)); pin=(taskset -c "$lo-$((lo + half - 1))")
  fi
  mkdir -p "$OUT/$i"
  # the carried data as start copied it beside the copies (else OPTLADDER_DATA as given), read by both
  data=${OPTLADDER_DATA:-$ROOT/.gpu-data}; [ -d "$COPIES/optladder-data" ] && data=$COPIES/optladder-data
  ( cd "$COPIES/copy-$i" && CUDA_VISIBLE_DEVICES=$gpu STATE=$COPIES/optladder-ladder-$i OUT="$OUT/$i" \
      OPTLADDER_CACHE=${OPTLADDER_CACHE:-/tmp/stage}/cache-$i OPTLADDER_DATA=$data \
      ${after[@]+"${after[@]}"} ${pin[@]+"${pin[@]}"} bash benchmarks/gpu_ladder.sh "$MODE" > "$OUT/$i/call.log" 2>&1
    echo $? > "$OUT/$i/rc" ) &
  pids+=($!)
done
wait "${pids[@]}"
RC=0
: > "$OUT/calls.log"
: > "$OUT/status.txt"
for i in a b; do
  rc=$(cat "$OUT/$i/rc" 2>/dev/null); rc=${rc:-1}
  echo "== copy $i (GPU $(gpu_of "$i")): exit status $rc" | tee -a "$OUT/status.txt"
  tail -12 "$OUT/$i/call.log"
  { echo "== copy $i"; cat "$OUT/$i/call.log"; } >> "$OUT/calls.log"
  # ladder.md, .json and .png are in the archive: what comes back is at most 8 files
  rm -f "$OUT/$i/call.log" "$OUT/$i/rc" "$OUT/$i/ladder.md" "$OUT/$i/ladder.json" "$OUT/$i/ladder.png"
  if [ "$rc" = 124 ]; then RC=124
  elif [ "$rc" != 0 ] && [ "$RC" = 0 ]; then RC=$rc; echo "copy $i ended with exit status $rc"; fi
done
if ! running a && ! running b && [ -f "$COPIES/optladder-ladder-a/rc" ] && [ -f "$COPIES/optladder-ladder-b/rc" ]; then
  [ -n "${SMOKE:-}" ] || export PYTHONPATH=/tmp/site-optladder  # the wheelhouse's install (gpu_ladder.sh stage)
  name_a=$(cat "$COPIES/optladder-ladder-a/detached-name" 2>/dev/null || echo first)
  name_b=$(cat "$COPIES/optladder-ladder-b/detached-name" 2>/dev/null || echo first)
  $PY -m optladder.experiments.ladder_compare "$COPIES/optladder-ladder-a/$name_a" "$COPIES/optladder-ladder-b/$name_b" \
    > "$OUT/compare.md" 2>&1
  echo "comparison ($PY -m experiments.ladder_compare): exit status $?" | tee -a "$OUT/status.txt"
  cat "$OUT/compare.md"
fi
exit "$RC"
