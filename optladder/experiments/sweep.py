"""A sweep's jobs (`python run.py -m ...`): what each job sweeps over, and what a job does when its opts
cannot run as asked. Decided from optladder/engine/opts.py's registry, never from a list of names:

- an opt that needs others (`needs`) gets them added, and the job says so in its name and tags
  (`-m '+opt=glob(*)'` runs prefix_cache as paged_kv+prefix_cache, as the switch benchmarks do);
- an opt that runs on CUDA only (`cuda_only`) is skipped on a machine without CUDA: the job records a
  skipped run with the reason, and the sweep's parent run lists it in sweep.md.

A single run (no -m) keeps refusing both, with the fix: asking for one exact config must get that config.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from optladder.engine.loader import resolve_device
from optladder.engine.opts import OPTS, enabled_opts
from optladder.experiments.errors import as_user_error
from optladder.experiments.run_views import SWEEP_TAG, run_name, run_tags
from optladder.experiments.tracking import Tracker

SWEEP_KEYS_ENV = "OPTLADDER_SWEEP_KEYS"  # set by the sweep callback for its jobs: the swept config keys
SKIPPED_FILE = "skipped.json"


@dataclass
class JobPlan:
    added_needs: list[str] = field(default_factory=list)
    skip_reason: str | None = None


def sweep_overrides(task_overrides: list[str]) -> list[str]:
    """The overrides of a multirun command line that sweep (`seed=1,2`, `+opt=glob(*)`), as written."""
    parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    return [o.input_line for o in parsed if o.is_sweep_override() and not o.key_or_group.startswith("hydra")]


def swept_keys(sweep_lines: list[str]) -> list[str]:
    return [o.key_or_group for o in OverridesParser.create().parse_overrides(list(sweep_lines))]


def job_swept_values(job_overrides: list[str]) -> dict[str, str]:
    """key -> value of this job's overrides of the swept keys (from the sweep callback's environment)."""
    keys = json.loads(os.environ.get(SWEEP_KEYS_ENV, "[]"))
    out = {}
    for o in OverridesParser.create().parse_overrides(list(job_overrides)):
        if o.key_or_group in keys:
            out[o.key_or_group] = o.get_value_element_as_str()
    return out


def sweep_job(cfg: DictConfig, run_dir: Path, job_overrides: list[str]) -> dict[str, str] | None:
    """A multirun job's tags (its swept values, the prerequisites added to cfg), or None when the job is
    skipped: then it is recorded as skipped, with the reason."""
    with as_user_error():
        plan = plan_job(cfg)
        tags = {f"{SWEEP_TAG}{k}": v for k, v in job_swept_values(job_overrides).items()}
        if plan.added_needs:
            tags["optladder.added_needs"] = ",".join(plan.added_needs)
        if plan.skip_reason is None:
            return tags
        name = record_skipped(OmegaConf.to_object(cfg), run_dir, tags, plan.skip_reason)
    print(f"skipped {name}: {plan.skip_reason}")
    return None


def plan_job(cfg: DictConfig) -> JobPlan:
    """Add the missing prerequisites of the job's opts to cfg.engine (in place) or give a reason to skip."""
    on = [name for name, spec in OPTS.items() if cfg.engine.get(spec.field)]
    plan = JobPlan()
    todo = list(on)
    while todo:  # prerequisites of prerequisites too
        for need in OPTS[todo.pop()].needs:
            if need not in on:
                on.append(need)
                plan.added_needs.append(need)
                todo.append(need)
    with open_dict(cfg.engine):
        for need in plan.added_needs:
            cfg.engine[OPTS[need].field] = True
    if cfg.engine.name == "reference":
        device = resolve_device(cfg.engine.device).type
        cuda_only = [n for n in on if OPTS[n].cuda_only]
        if cuda_only and device != "cuda":
            verb = "runs" if len(cuda_only) == 1 else "run"
            plan.skip_reason = f"{' and '.join(cuda_only)} {verb} on CUDA only and this engine runs on {device}"
    return plan


def record_skipped(conf, run_dir: Path, tags: dict[str, str], reason: str) -> str:
    """skipped.json in the job's directory and a child run in MLflow (status KILLED, tag optladder.skipped)
    that says why: a sweep names what it did not run. Returns the run's name."""
    opts = enabled_opts(conf.engine)
    tags = {**run_tags(conf, opts, {}), **tags, "optladder.skipped": reason}
    name = f"{run_name(conf, opts, tags)} (skipped)"
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / SKIPPED_FILE).write_text(json.dumps({"run_name": name, "skipped": reason}, indent=2))
    with Tracker(conf.tracking, name, tags) as tracker:
        tracker.end("KILLED")
    return name
