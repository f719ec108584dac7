#!/usr/bin/env bash
# Ray against the local launcher on one machine: the same 4-job sweep of the tiny model, first with Hydra's
# local launcher (jobs one after another in this process), then with hydra/launcher=ray (each job a Ray task
# in a worker process, as many at once as the CPUs allow), both logging to one MLflow server started here on
# 127.0.0.1 (SQLite) and stopped after. Prints and writes a markdown table: each sweep's wall time, its parent
# run and the children under it, and their statuses.
#   bash benchmarks/ray_vs_local.sh [OUT.md]        (default benchmarks/results/ray_vs_local_cpu.md)
# RAY_memory_monitor_refresh_ms=0: Ray's memory monitor counts the whole machine's memory and kills tasks when
# other work fills it; on a shared machine it is off here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${PORT:-5077}
OUTMD=${1:-benchmarks/results/ray_vs_local_cpu.md}
DIR=$(mktemp -d /tmp/ray_vs_local.XXXX)
$PY -m optladder.experiments.tracking_server --backend-store-uri "sqlite:///$DIR/mlflow.db" \
    --artifacts-destination "$DIR/artifacts" --port "$PORT" --workers 1 > "$DIR/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
up=
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && { up=1; break; }; sleep 1; done
[ -n "$up" ] || { echo "the MLflow server did not answer on 127.0.0.1:$PORT in 60 s:"; tail -20 "$DIR/server.log"; exit 1; }
ARGS=(model=tiny seed=1,2,3,4 workload.num_requests=${NREQ:-8} quality.num_prompts=${NPROMPTS:-8}
      "tracking.uri=http://127.0.0.1:$PORT")
declare -A WALL
for launcher in basic ray; do
  extra=(); [ $launcher = ray ] && extra=(hydra/launcher=ray)
  s0=$SECONDS
  RAY_memory_monitor_refresh_ms=0 $PY run.py -m "${extra[@]}" "${ARGS[@]}" "hydra.sweep.dir=$DIR/sweep_$launcher" \
      > "$DIR/$launcher.log" 2>&1 || echo "the $launcher sweep exited $? (log: $DIR/$launcher.log)"
  WALL[$launcher]=$((SECONDS - s0))
done
$PY - "$PORT" "${WALL[basic]}" "${WALL[ray]}" "$OUTMD" "$(nproc)" "$(cat /proc/loadavg)" "$DIR" "${ARGS[*]}" <<'PYEOF'
import sys, platform
import mlflow, ray, torch
from mlflow.tracking import MlflowClient
port, wall_local, wall_ray, out, ncpu, load, tmp, args = (sys.argv[1], float(sys.argv[2]), float(sys.argv[3]),
                                                          sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8])
client = MlflowClient(f"http://127.0.0.1:{port}")
exp = client.get_experiment_by_name("optladder")
runs = client.search_runs([exp.experiment_id], max_results=1000, order_by=["attributes.start_time ASC"])
children = {}
for r in runs:
    p = r.data.tags.get("mlflow.parentRunId")
    if p:
        children.setdefault(p, []).append(r)
by_dir = {r.data.tags.get("sweep_dir"): r for r in runs if r.data.tags.get("optladder.kind") == "sweep"}
lines = ["# The same 4-job sweep under the local launcher and under Ray, on this CPU machine", "",
         f"- command: `bash benchmarks/ray_vs_local.sh`: `run.py -m {args.rsplit(' tracking.uri', 1)[0]}` with the "
         "local launcher, then with `hydra/launcher=ray`, against one MLflow server on 127.0.0.1 (SQLite)",
         f"- {ncpu} CPUs, Python {platform.python_version()}, torch {torch.__version__}, Ray {ray.__version__}, "
         f"MLflow {mlflow.__version__}; load average at the end: {load}", "",
         "| launcher | wall time s | ratio to local | parent run | children | child statuses |", "|---|---|---|---|---|---|"]
for name, wall, sub in (("local (basic)", wall_local, "sweep_basic"), ("ray", wall_ray, "sweep_ray")):
    parent = by_dir.get(f"{tmp}/{sub}")
    if parent is None:
        lines.append(f"| {name} | {wall:.0f} | {wall / wall_local:.2f}x | no parent run on the server | 0 | - |")
        continue
    kids = children.get(parent.info.run_id, [])
    st = sorted({k.info.status for k in kids})
    lines.append(f"| {name} | {wall:.0f} | {wall / wall_local:.2f}x | {parent.info.run_name} ({parent.info.status}) "
                 f"| {len(kids)} | {', '.join(st)} |")
text = "\n".join(lines) + "\n"
print(text)
open(out, "w").write(text)
PYEOF
