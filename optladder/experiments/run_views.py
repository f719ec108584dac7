"""What a run looks like in the MLflow UI: a name and tags that tell sweep jobs apart, the evidence that
each opt ran as tags and params one can filter on, and the KV curves of the replay on a real time axis.

- name: `engine:opts:model`, then `key=value` for every swept key the name does not show already
  (`reference:baseline:tiny seed=1`); the sweep callback names the swept keys.
- tags: engine, model, opts, workload, dtype (resolved: auto is float32 on a CPU), device, seed, git_commit,
  `profiled` when +profile ran, `optladder.lengths_changed=true` (and the other tags of
  traffic.workload.departures) when the replay departs from its trace, `sweep.<key>` per swept key, and `opt.<name>` = on | off as really in
  effect (opts_effective), so `tags."opt.paged_kv" = "on"` finds the runs where paged KV ran; the evidence
  itself is in the params `opts_effective.<opt>.<field>`.
- KV curves `kv/reserved_gb`, `kv/used_gb`, `kv/util`: the replay only (not warm-up, quality or capacity
  probes), each point at its wall-clock time, step = milliseconds since the replay started (MLflow
  steps are integers; the UI's "Relative time" axis shows seconds).
"""
from __future__ import annotations

import time

from optladder.engine.loader import resolve_device, resolve_dtype
from optladder.traffic.workload import departures

SWEEP_TAG = "sweep."
# keys a run's name shows already (engine:opts:model), so a sweep over them adds nothing to it
NAMED_KEYS = ("engine", "model", "opt")
MAX_CURVE_POINTS = 500


def run_name(conf, opts: list[str], tags: dict[str, str]) -> str:
    base = f"{conf.engine.name}:{'+'.join(opts) or 'baseline'}:{conf.model.name}"
    swept = [f"{k[len(SWEEP_TAG):]}={v}" for k, v in tags.items()
             if k.startswith(SWEEP_TAG) and k[len(SWEEP_TAG):] not in NAMED_KEYS]
    return " ".join([base, *swept])


def run_tags(conf, opts: list[str], environment: dict, workload_stats: dict[str, float] | None = None) -> dict[str, str]:
    """workload_stats: the built workload's stats, whose departures from the trace become tags."""
    try:
        dtype = str(resolve_dtype(conf.engine.dtype, resolve_device(conf.engine.device))).replace("torch.", "")
    except ValueError:  # a device this machine lacks: the engine refuses it later, with the fix
        dtype = conf.engine.dtype
    tags = {"engine": conf.engine.name, "model": conf.model.name, "opts": ",".join(opts) or "baseline",
            "workload": conf.workload.name, "quality": conf.quality.name, "dtype": dtype,
            "device": environment.get("gpu") or "cpu", "seed": str(conf.seed),
            "git_commit": str(environment.get("git_commit"))}
    if conf.profile is not None:  # its profiled steps ran slower: not a run to gate on
        tags["profiled"] = conf.profile.name
    tags.update({tag: "true" for tag in departures(workload_stats or {})})
    return tags


def effective_tags_params(effective: dict[str, dict]) -> tuple[dict[str, str], dict[str, str]]:
    """opts_effective as tags `opt.<name>` = on | off, and its evidence as params."""
    tags = {f"opt.{name}": "on" if ev.get("on") else "off" for name, ev in effective.items()}
    params = {f"opts_effective.{name}.{k}": str(v)[:6000] for name, ev in effective.items()
              for k, v in ev.items() if k != "on"}
    return tags, params


def kv_curves(points: list[tuple[float, int, int]], t_start: float) -> tuple[dict, list[int], list[int]]:
    """(series, steps, wall-clock ms) of the KV points (monotonic time, reserved bytes, used bytes)."""
    points = points[::max(1, -(-len(points) // MAX_CURVE_POINTS))]  # a curve, not a row per engine step
    gib = float(1 << 30)
    wall_offset = time.time() - time.monotonic()
    series = {"kv/reserved_gb": [r / gib for _, r, _ in points], "kv/used_gb": [u / gib for _, _, u in points],
              "kv/util": [u / r if r else 0.0 for _, r, u in points]}
    steps = [max(0, int((t - t_start) * 1000)) for t, _, _ in points]
    stamps = [int((t + wall_offset) * 1000) for t, _, _ in points]
    return series, steps, stamps
