#!/usr/bin/env bash
# The H200 soak: the builtin workload at 8 req/s in a loop, Llama-3-8B's shape (random bf16 weights), every
# lossless switch on, 5% bad requests (benchmarks/gpu_soak.py); results under $OUT/soak.
#   bash benchmarks/gpu_soak.sh [ARGS]          one device call: 8 minutes (a call lasts at most 10)
#   bash benchmarks/gpu_soak.sh start [ARGS]    the soak in its own process session (setsid) for MINUTES
#                                               (default 10); this call waits WAIT_S (default 560) and returns
#   bash benchmarks/gpu_soak.sh collect         the next call, made at once on the same warm machine: waits for
#                                               the soak to end and copies its results to $OUT/soak
# (OUT defaults to ./gpu_out). A soak longer than one call lives through two: a process started with setsid
# outlives the call that started it, until the machine goes back (~30 s idle), so `collect` must follow at once.
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_detached.sh  # detach, wait_rc
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT/soak"
export PYTHONUNBUFFERED=1
SOAK=/tmp/soak
case "${1:-}" in
  start)
    shift
    rm -rf "$SOAK" && mkdir -p "$SOAK"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$SOAK/nvidia_smi.txt"
    detach "$SOAK" "$SOAK/log.txt" python3 benchmarks/gpu_soak.py --out "$SOAK" --minutes "${MINUTES:-10}" "$@"
    POLL_S=20 wait_rc "$SOAK" $((SECONDS + ${WAIT_S:-560}))
    tail -5 $SOAK/log.txt
    ;;
  collect)
    for _ in $(seq 1 ${COLLECT_WAIT_S:-240}); do [ -f $SOAK/rc ] && break; sleep 1; done
    [ -f $SOAK/rc ] || echo "the soak has not ended: copying what it wrote so far"
    cp $SOAK/*.json $SOAK/*.md $SOAK/*.png $SOAK/*.txt $SOAK/rc "$OUT/soak/" 2>/dev/null
    (cd $SOAK && tar czf "$OUT/soak/records.tgz" ./*.jsonl 2>/dev/null)
    tail -30 $SOAK/log.txt
    [ -f $SOAK/rc ] && exit "$(cat $SOAK/rc)"
    exit 124
    ;;
  *)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/soak/nvidia_smi.txt"
    timeout 570 python3 benchmarks/gpu_soak.py --out "$OUT/soak" "$@" 2>&1 | tee "$OUT/soak/log.txt"
    ;;
esac
