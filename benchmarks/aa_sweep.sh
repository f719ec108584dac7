#!/usr/bin/env bash
# The A/A calibration on a CPU: 20 A/As of SmolLM2 (control = candidate = the baseline), seeds 1-10 with
# the control opening and seeds 11-20 with the candidate opening, then the summary (verdict counts, the
# spread of every gate's deltas, the coverage of zero, the run noise a gate should assume).
#   bash benchmarks/aa_sweep.sh [OUT_DIR] [extra overrides...]      (hours on a shared 2-core machine)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/aa_sweep}
shift || true
PY=${PY:-.venv/bin/python}
COMMON=(+ab=aa engine.cpu_threads=1 quality.num_prompts=20 tracking.enabled=false replay.progress=false "$@")
$PY run.py -m "${COMMON[@]}" 'seed=range(1,11)' ab.first=control hydra.sweep.dir="$OUT/first_control" || true
$PY run.py -m "${COMMON[@]}" 'seed=range(11,21)' ab.first=candidate hydra.sweep.dir="$OUT/first_candidate" || true
$PY -m optladder.experiments.ab_summary "$OUT" --out "$OUT/ab_summary"
