"""What a run looks like in the MLflow UI: a name and tags that tell sweep jobs apart, the evidence that
each opt ran as tags and params one can filter on, and the KV curves of the replay on a real time axis.

- name: `engine:opts:model`, then what else tells the run's inputs apart (`identity`): `workload=<file stem>`
  for a trace (any file a loader reads, not the loader's name), `quality=<file stem>` for a user's prompt set
  (or the set's name for another built-in set), `seed=<n>` when not 0, `workload.seed=<n>` when it differs
  from the seed; then `key=value` for every swept key the name does not show already
  (`reference:baseline:tiny workload=azure_conv_2023 seed=1`); the sweep callback names the swept keys.
- tags: engine, model, opts, workload (the loader), `workload.file` (the trace's file name), quality (the set),
  `quality.file` (a user set's file name), dtype (resolved: auto is float32 on a CPU), device, seed, git_commit,
  `profiled` when +profile ran, `optladder.lengths_changed=true` (and the other tags of
  traffic.workload.departures) when the replay departs from its trace, `sweep.<key>` per swept key, and `opt.<name>` = on | off as really in
  effect (opts_effective), so `tags."opt.paged_kv" = "on"` finds the runs where paged KV ran; the evidence
  itself is in the params `opts_effective.<opt>.<field>`.
- dataset inputs (MLflow's Datasets panel): the workload replayed and the prompt set scored, each named by its
  file, with the file as source and the digest of exactly what was replayed or scored (`dataset_inputs`).
- KV curves `kv/reserved_gb`, `kv/used_gb`, `kv/util`: the replay only (not warm-up, quality or capacity
  probes), each point at its wall-clock time, step = milliseconds since the replay started (MLflow
  steps are integers; the UI's "Relative time" axis shows seconds).
"""
from __future__ import annotations

import time

from pathlib import Path

from optladder.engine.loader import resolve_device, resolve_dtype
from optladder.traffic.workload import DEFAULT_PATH, departures

SWEEP_TAG = "sweep."
# keys a run's name shows already (engine:opts:model), so a sweep over them adds nothing to it
NAMED_KEYS = ("engine", "model", "opt")
# the swept keys an `identity` entry shows already, when it is in the name
SHOWN_BY = {"workload": ("workload", "workload.name", "workload.path"),
            "quality": ("quality", "quality.name", "quality.path"), "seed": ("seed",), "workload.seed": ("workload.seed",)}
MAX_CURVE_POINTS = 500


def workload_file(workload) -> str | None:
    """The file a workload reads (as configured: absolute, or under the data root); None for builtin."""
    return None if workload.name == "builtin" else (workload.path or DEFAULT_PATH[workload.name])


def identity(conf) -> dict[str, str]:
    """What tells a run's inputs apart beyond engine, opts and model, as `key: value` for its name: the trace's
    file stem, a user prompt set's file stem (another set than builtin by its name), the seed when not 0 and the
    workload's seed where it differs. A default run (builtin workload and set, seed 0) has none."""
    out: dict[str, str] = {}
    trace = workload_file(conf.workload)
    if trace is not None:
        out["workload"] = Path(trace).stem
    if conf.quality.name == "jsonl":
        out["quality"] = Path(conf.quality.path).stem
    elif conf.quality.name != "builtin":
        out["quality"] = conf.quality.name
    if conf.seed != 0:
        out["seed"] = str(conf.seed)
    if conf.workload.seed != conf.seed:
        out["workload.seed"] = str(conf.workload.seed)
    return out


def run_name(conf, opts: list[str], tags: dict[str, str]) -> str:
    base = f"{conf.engine.name}:{'+'.join(opts) or 'baseline'}:{conf.model.name}"
    shown = identity(conf)
    covered = {k for key in shown for k in SHOWN_BY[key]}
    swept = [f"{k[len(SWEEP_TAG):]}={v}" for k, v in tags.items()
             if k.startswith(SWEEP_TAG) and k[len(SWEEP_TAG):] not in (*NAMED_KEYS, *covered)]
    return " ".join([base, *(f"{k}={v}" for k, v in shown.items()), *swept])


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
    trace = workload_file(conf.workload)
    if trace is not None:
        tags["workload.file"] = Path(trace).name
    if conf.quality.name == "jsonl":
        tags["quality.file"] = Path(conf.quality.path).name
    if conf.profile is not None:  # its profiled steps ran slower: not a run to gate on
        tags["profiled"] = conf.profile.name
    tags.update({tag: "true" for tag in departures(workload_stats or {})})
    return tags


def dataset_inputs(conf, prepared) -> list[dict]:
    """The run's MLflow dataset inputs, as Tracker.log_dataset arguments: the workload (context `replay`) and the
    prompt set (context `quality`), each named by its file's stem, its source the file itself, its digest that of
    exactly the requests replayed (traffic.request.requests_digest) or the prompts scored (prompts_digest)."""
    from optladder.quality.prompts import ALPACA_EVAL_FILE, BUILTIN_PATH, SELF_INSTRUCT_FILE, prompts_digest
    from optladder.traffic.data_root import resolve_data_path
    from optladder.traffic.materialize import BUILTIN_TEXT
    from optladder.traffic.request import requests_digest

    trace = workload_file(conf.workload)
    source = BUILTIN_TEXT if trace is None else resolve_data_path(trace, conf.data.root)
    workload = {"name": "builtin" if trace is None else Path(trace).stem, "source": str(Path(source).resolve()),
                "digest": requests_digest(prepared.workload.requests), "context": "replay"}
    q = conf.quality
    rel = {"alpaca_eval": ALPACA_EVAL_FILE, "self_instruct": SELF_INSTRUCT_FILE}.get(q.name)
    path = (BUILTIN_PATH if q.name == "builtin" else Path(q.path).expanduser() if q.name == "jsonl"
            else resolve_data_path(rel, conf.data.root))
    prompts = {"name": q.name if q.name != "jsonl" else Path(path).stem, "source": str(Path(path).resolve()),
               "digest": prompts_digest(prepared.items), "context": "quality"}
    return [workload, prompts]


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
