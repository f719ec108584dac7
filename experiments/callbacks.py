"""A Hydra multirun becomes one MLflow parent run with a child run per job."""
from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from experiments.lifecycle import EXIT_TRACKING
from experiments.tracking import PARENT_ENV, resolve_uri


class MLflowSweepCallback(Callback):
    def __init__(self) -> None:
        self.parent_run_id: str | None = None
        self.failed = 0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not config.tracking.enabled:
            return
        import mlflow
        from mlflow.tracking import MlflowClient

        from experiments.tracking_server import TrackingUnavailable, artifact_location, check_uri, redact

        try:
            uri = check_uri(resolve_uri(config.tracking.uri))  # before any job starts, whatever the launcher
        except (TrackingUnavailable, ValueError) as e:
            # Hydra turns a callback's Exception into a warning and starts the jobs anyway: exit instead
            print(f"error: {e}", file=sys.stderr)  # a server down: 69 (lifecycle.py); a driver missing: a setting
            raise SystemExit(EXIT_TRACKING if isinstance(e, TrackingUnavailable) else 2) from None
        mlflow.set_tracking_uri(uri)
        client = MlflowClient()
        try:
            exp = client.get_experiment_by_name(config.tracking.experiment)
            exp_id = exp.experiment_id if exp else client.create_experiment(
                config.tracking.experiment, artifact_location=artifact_location(uri))
            sweep = " ".join(config.hydra.overrides.task) if "hydra" in config else ""
            run = client.create_run(exp_id, run_name=f"sweep: {sweep}"[:250] or "sweep",
                                    tags={"optladder.kind": "sweep", "sweep_dir": str(config.hydra.sweep.dir)})
        except Exception as e:  # noqa: BLE001 - before any job: say so and stop (experiments/lifecycle.py)
            logging.getLogger("optladder").error("tracking.uri=%s: the MLflow store is unreachable (%s: %s); start "
                                                 "it or fix tracking.uri, or run with tracking.enabled=false",
                                                 redact(config.tracking.uri), type(e).__name__, str(e)[:300])
            raise SystemExit(EXIT_TRACKING) from None
        self.parent_run_id = run.info.run_id
        os.environ[PARENT_ENV] = self.parent_run_id  # launchers hand it to jobs in other processes
        # a failed job makes Hydra's sweeper raise before on_multirun_end: close the parent as FAILED then
        atexit.register(self._close, "FAILED")

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        if getattr(job_return, "status", None) == JobStatus.FAILED:
            self.failed += 1

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("ab") is not None:  # a sweep of A/Bs (an A/A calibration): ab_summary.md beside the jobs
            from pathlib import Path

            from experiments.ab_summary import write_summary

            sweep = Path(config.hydra.sweep.dir)
            write_summary([sweep], sweep / "ab_summary", f"A/B sweep {config.ab.name}")
        self._close("FAILED" if self.failed else "FINISHED")

    def _close(self, status: str) -> None:
        if self.parent_run_id is None:
            return
        from mlflow.tracking import MlflowClient

        MlflowClient().set_terminated(self.parent_run_id, status=status)
        self.parent_run_id = None
        os.environ.pop(PARENT_ENV, None)
