"""A Hydra multirun becomes one MLflow parent run with a child run per job.

The parent is named by what the sweep sweeps (`sweep: +opt=glob(*), seed=1,2`), not by the whole command
line (the rest is in its tags). The jobs learn the swept keys from the environment, to put their values in
their own names and tags. At the end the parent gets sweep.md (each job: ran, skipped and why, or failed)
and, where the jobs ran load levels, their latency-throughput curves and Pareto frontier, the best config
under the SLO and the A/B command that gates it against the sweep's defaults (optladder/experiments/slo_pick.py).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from optladder.experiments.lifecycle import EXIT_TRACKING
from optladder.experiments.levels import read_levels
from optladder.experiments.load_curves import write_load_curves
from optladder.experiments.slo_pick import best_under_slo, gate
from optladder.experiments.sweep import SKIPPED_FILE, SWEEP_KEYS_ENV, job_swept_values, sweep_overrides, swept_keys
from optladder.experiments.tracking import PARENT_ENV, ensure_experiment, resolve_uri
from optladder.traffic.metrics import SLO

_active: list["MLflowSweepCallback"] = []  # the running sweep, for run.py to close when a job raised


class MLflowSweepCallback(Callback):
    def __init__(self) -> None:
        self.parent_run_id: str | None = None
        self.failed = 0
        self.jobs: list[dict] = []
        self.sweep_dir: Path | None = None
        self.slo: SLO | None = None
        self.keys: list[str] = []  # the swept config keys
        self.base: list[str] = []  # the command line's overrides that do not sweep
        self.defaults: dict[str, str] = {}  # each swept key's value without its sweep

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        task = list(config.hydra.overrides.task) if "hydra" in config else []
        preset = OmegaConf.select(config, "hydra.sweeper.params") or {}
        lines = sweep_overrides(task) + [f"{k}={v}" for k, v in preset.items()]
        os.environ[SWEEP_KEYS_ENV] = json.dumps(swept_keys(lines))
        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.keys = swept_keys(lines)
        self.base = [o for o in task if o not in set(sweep_overrides(task))]
        self.defaults = _defaults(config, self.keys)
        try:
            self.slo = SLO(**OmegaConf.to_container(config.slo, resolve=True)) if "slo" in config else None
        except (TypeError, ValueError) as e:  # the jobs refuse it too, each with the message
            logging.getLogger("optladder").warning("slo: %s; the sweep names no best config", e)
        _active[:] = [self]
        if not config.tracking.enabled:
            return
        import mlflow
        from mlflow.tracking import MlflowClient

        from optladder.experiments.tracking_server import TrackingUnavailable, check_uri, redact

        try:
            uri = check_uri(resolve_uri(config.tracking.uri))  # before any job starts, whatever the launcher
        except (TrackingUnavailable, ValueError) as e:
            # Hydra turns a callback's Exception into a warning and starts the jobs anyway: exit instead
            print(f"error: {e}", file=sys.stderr)  # a server down: 69 (lifecycle.py); a driver missing: a setting
            raise SystemExit(EXIT_TRACKING if isinstance(e, TrackingUnavailable) else 2) from None
        mlflow.set_tracking_uri(uri)
        client = MlflowClient()
        name = f"sweep: {', '.join(lines)}" if lines else "sweep"
        try:
            exp_id = ensure_experiment(client, config.tracking)
            run = client.create_run(exp_id, run_name=name[:250],
                                    tags={"optladder.kind": "sweep", "sweep_dir": str(self.sweep_dir),
                                          "sweep.overrides": " ".join(task)[:5000], "sweep.swept": ", ".join(lines)})
        except Exception as e:  # noqa: BLE001 - before any job: say so and stop (optladder/experiments/lifecycle.py)
            logging.getLogger("optladder").error("tracking.uri=%s: the MLflow store is unreachable (%s: %s); start "
                                                 "it or fix tracking.uri, or run with tracking.enabled=false",
                                                 redact(config.tracking.uri), type(e).__name__, str(e)[:300])
            raise SystemExit(EXIT_TRACKING) from None
        self.parent_run_id = run.info.run_id
        os.environ[PARENT_ENV] = self.parent_run_id  # launchers hand it to jobs in other processes
        # a failed job makes Hydra's sweeper raise before on_multirun_end: close the parent as FAILED then
        atexit.register(finish_active_sweep)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        out = Path(job_return.hydra_cfg.hydra.runtime.output_dir) if job_return.hydra_cfg else None
        status = _job_status(out)
        if getattr(job_return, "status", None) == JobStatus.FAILED and not status.startswith("failed"):
            status = "failed (traceback above)"
        self.failed += status.startswith("failed")
        values = job_swept_values(job_return.overrides or [])
        swept = " ".join(f"{k}={v}" for k, v in values.items())
        self.jobs.append({"job": len(self.jobs), "swept": swept, "dir": out, "status": status,
                          "name": _job_name(out), "values": values,
                          "overrides": [str(o) for o in job_return.overrides or []]})

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("ab") is not None:  # a sweep of A/Bs (an A/A calibration): ab_summary.md beside the jobs
            from optladder.experiments.ab_summary import write_summary

            sweep = Path(config.hydra.sweep.dir)
            write_summary([sweep], sweep / "ab_summary", f"A/B sweep {config.ab.name}")
        self.finish()

    def finish(self) -> None:
        """sweep.md, the load curves and the parent's status; also called by run.py when a job raised."""
        _active[:] = []
        if not self.jobs and self.sweep_dir is not None:
            # a launcher that ran the jobs in other processes (Ray, SLURM): their on_job_end ran there, so
            # they are read back from their directories (before the swept keys leave the environment)
            self.jobs = _jobs_from_dirs(self.sweep_dir)
            self.failed = sum(j["status"].startswith("failed") for j in self.jobs)
        os.environ.pop(SWEEP_KEYS_ENV, None)
        os.environ.pop(PARENT_ENV, None)
        if self.sweep_dir is None:
            return
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        table = sweep_table(self.jobs)
        (self.sweep_dir / "sweep.md").write_text(table)
        print(table)
        by_label = {_job_label(j): j for j in self.jobs if j["dir"] is not None}
        curves = {k: v for k, v in ((k, read_levels(j["dir"])) for k, j in by_label.items()) if v}
        pick = the_gate = None
        if curves and self.slo is not None:
            pick = best_under_slo(curves, self.slo)
            best = pick["best"]
            job = by_label[best["config"]] if best is not None else {}
            the_gate = gate(best, self._swept_overrides(job.get("overrides", [])), self.base, self.defaults,
                            self.sweep_dir, job.get("values") == self.defaults)
        written = write_load_curves(curves, self.sweep_dir, pick, the_gate)
        if written and pick is not None:
            print(pick["summary"])
            if the_gate["command"]:
                print("gate it against the defaults (an A/B; the sweep does not run it):\n  " + the_gate["command"])
                written.append(Path(the_gate["ab_config"]))
            else:
                print(the_gate["why"])
        if self.parent_run_id is None:
            return
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        for path in [self.sweep_dir / "sweep.md", *written]:
            client.log_artifact(self.parent_run_id, str(path))
        client.set_terminated(self.parent_run_id, status="FAILED" if self.failed else "FINISHED")
        self.parent_run_id = None

    def _swept_overrides(self, overrides: list[str]) -> list[str]:
        """A job's overrides of the swept keys, as its command line wrote them."""
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        return [o.input_line for o in parsed if o.key_or_group in self.keys]


def _defaults(config: DictConfig, keys: list[str]) -> dict[str, str]:
    """Each swept key's value in the sweep's base config (Hydra composes it without the sweeping overrides):
    a group's choice, a key's value; a key the base config lacks (`+opt=...`) is left out."""
    choices = OmegaConf.select(config, "hydra.runtime.choices") or {}
    out = {}
    for k in keys:
        if k in choices:
            out[k] = str(choices[k])
            continue
        v = OmegaConf.select(config, k, default=None, throw_on_missing=False)
        if v is not None and not OmegaConf.is_config(v):
            out[k] = str(v)
    return out


def _jobs_from_dirs(sweep_dir: Path) -> list[dict]:
    """Every job directory under the sweep's (each has .hydra/overrides.yaml), in job order."""
    def order(d: Path) -> tuple:
        return (0, int(d.name), "") if d.name.isdigit() else (1, 0, str(d))

    jobs = []
    for out in sorted((f.parent.parent for f in sweep_dir.glob("*/.hydra/overrides.yaml")), key=order):
        overrides = [str(o) for o in OmegaConf.load(out / ".hydra" / "overrides.yaml")]
        values = job_swept_values(overrides)
        swept = " ".join(f"{k}={v}" for k, v in values.items())
        jobs.append({"job": len(jobs), "swept": swept, "dir": out, "status": _job_status(out), "name": _job_name(out),
                     "values": values, "overrides": overrides})
    return jobs


def _job_status(out: Path | None) -> str:
    if out is None:
        return "unknown"
    if (out / SKIPPED_FILE).is_file():
        return "skipped: " + json.loads((out / SKIPPED_FILE).read_text())["skipped"]
    if (out / "summary.json").is_file() or (out / "verdict.json").is_file() or _ladder_ended(out / "ladder.json"):
        return "ran"
    err = out / "error.txt"
    return "failed: " + (err.read_text().strip().splitlines() or [""])[-1][:200] if err.is_file() else "failed"


def _ladder_ended(path: Path) -> bool:
    """A ladder.json of a ladder that ended (one is written after every rung, `complete: false` until the end)."""
    try:
        return path.is_file() and json.loads(path.read_text()).get("complete", True) is not False
    except (OSError, ValueError, AttributeError):
        return False


def _job_name(out: Path | None) -> str | None:
    """The job's MLflow run name, from what it left in its directory."""
    for name in ("summary.json", SKIPPED_FILE):
        if out is not None and (out / name).is_file():
            return json.loads((out / name).read_text()).get("run_name")
    return None


def _job_label(job: dict) -> str:
    return job["name"] or f"job {job['job']}"


def sweep_table(jobs: list[dict]) -> str:
    lines = ["| job | swept | run | outcome | run dir |", "|---|---|---|---|---|"]
    lines += [f"| {j['job']} | {j['swept'] or '-'} | {j['name'] or '-'} | {j['status']} | {j['dir']} |" for j in jobs]
    return "\n".join(lines) + "\n"


def finish_active_sweep() -> None:
    """Close the parent run of a sweep a job's exception cut short (Hydra skips on_multirun_end then)."""
    for cb in list(_active):
        cb.failed = max(cb.failed, 1)
        cb.finish()
