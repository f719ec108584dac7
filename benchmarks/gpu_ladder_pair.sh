#!/usr/bin/env bash
# Does the GPU ladder reproduce? Two copies of the same ladder at once on a two-GPU host (kind nvidia-h200-x2), each
# from its own copy of this checkout, on its own GPU, with its own ladder directory, MLflow store and converted
# model: two independent runs in one session's device time, then experiments/ladder_compare.py on the two (the same
# settings, the same verdict at every rung, each headline metric within noise). Both copies share the host's CPUs,
# so this says what two runs of the README's commands give on one machine; a run in another session, on another
# machine, compares the same way (`python -m experiments.ladder_compare A B` here).
# Device calls (kind nvidia-h200-x2), back to back on one warm machine, as for benchmarks/gpu_ladder.sh:
#   1  bash benchmarks/gpu_ladder.sh stage                  carry: wheelhouse .stage/mei   (installs into /tmp)
#   2  bash benchmarks/gpu_ladder.sh stage                  carry: .stage/a
#   3  bash benchmarks/gpu_ladder.sh stage                  carry: .stage/b
#   4  OPTLADDER_DATA=$PWD/.gpu-data-slim MODEL=smollm2 TS=.. N=.. LADDER_S=.. bash benchmarks/gpu_ladder_pair.sh start
#                                                           carry: .gpu-data-slim
#   5… MODEL=smollm2 bash benchmarks/gpu_ladder_pair.sh wait     (exit status 124 while either still runs)
# Every setting of gpu_ladder.sh (MODEL, TS, N, RUNGS, BASELINE, EXTRA, LADDER_S, STOP_AFTER) is passed to both.
# What comes back: $OUT/a/ladder-<mode>.tgz and $OUT/b/ladder-<mode>.tgz (each a gpu_ladder.sh archive), and once
# both ended $OUT/compare.md (the comparison; its exit status in $OUT/compare.rc).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
case "$MODE" in start|wait) ;; *) echo "usage: $0 start|wait (a pair of detached ladders, GPUs 0 and 1)"; exit 2 ;; esac
OUT=${OUT:-$PWD/gpu_out}
ROOT=$PWD
PY=${PY:-python3}
COPIES=${COPIES:-/tmp}  # the two copies go to $COPIES/copy-a and copy-b, their ladders to $COPIES/optladder-ladder-a, -b
if [ "$MODE" = start ]; then
  n=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ -n "${SMOKE:-}" ] || [ "$n" -ge 2 ] || { echo "two GPUs needed (kind nvidia-h200-x2); nvidia-smi lists $n"; exit 2; }
  if [ "${MODEL:-8b}" = smollm2 ] && [ -z "${SMOKE:-}" ]; then  # joined once here: two copies at once would race
    source benchmarks/gpu_smollm2.sh
    [ ${#SMOL[@]} -gt 0 ] || { echo "MODEL=smollm2 needs the GGUF pieces: see gpu_ladder.sh's header"; exit 2; }
  fi
  for i in a b; do  # a copy of the checkout as it came: its files, no carried staging, no earlier outputs
    rm -rf "$COPIES/copy-$i" && mkdir -p "$COPIES/copy-$i"
    if [ -d .git ]; then git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -
    else  # the device's copy of a working tree has no .git: its ignored paths are the carried ones and outputs
      tar cf - --exclude=./.stage --exclude=./wheelhouse --exclude='./.vllm*' --exclude=./gpu_out \
        --exclude=./outputs --exclude='./.gpu-data*' --exclude=./.venv --exclude=./.cache .
    fi | tar xf - -C "$COPIES/copy-$i" || exit 1
  done
fi
pids=()
for i in a b; do
  [ -d "$COPIES/copy-$i" ] || { echo "no $COPIES/copy-$i: '$0 start' first on this machine"; exit 2; }
  gpu=0; [ "$i" = b ] && gpu=1
  mkdir -p "$OUT/$i"
  # OPTLADDER_DATA (absolute) stays this checkout's carried data, read by both
  ( cd "$COPIES/copy-$i" && CUDA_VISIBLE_DEVICES=$gpu STATE=$COPIES/optladder-ladder-$i OUT="$OUT/$i" \
      OPTLADDER_CACHE=${OPTLADDER_CACHE:-/tmp/stage}/cache-$i OPTLADDER_DATA=${OPTLADDER_DATA:-$ROOT/.gpu-data} \
      bash benchmarks/gpu_ladder.sh "$MODE" > "$OUT/$i/call.log" 2>&1; echo $? > "$OUT/$i/rc" ) &
  pids+=($!)
done
wait "${pids[@]}"
RC=0
for i in a b; do
  rc=$(cat "$OUT/$i/rc"); echo "== copy $i (GPU $([ $i = a ] && echo 0 || echo 1)): exit status $rc"
  tail -12 "$OUT/$i/call.log"
  rm -f "$OUT/$i/ladder.json" "$OUT/$i/ladder.png"  # in the archive; what comes back is at most 8 files
  [ "$rc" -gt "$RC" ] && RC=$rc
done
if [ -f "$COPIES/optladder-ladder-a/rc" ] && [ -f "$COPIES/optladder-ladder-b/rc" ]; then
  [ -n "${SMOKE:-}" ] || export PYTHONPATH=/tmp/site-optladder  # the wheelhouse's install (gpu_ladder.sh stage)
  $PY -m experiments.ladder_compare "$COPIES/optladder-ladder-a/first" "$COPIES/optladder-ladder-b/first" \
    > "$OUT/compare.md" 2>&1
  echo $? > "$OUT/compare.rc"
  cat "$OUT/compare.md"
fi
exit "$RC"
