"""A Hydra multirun becomes one MLflow parent run with a child run per job."""
from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

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

        from experiments.tracking_server import TrackingUnavailable, artifact_location, check_uri

        try:
            uri = check_uri(resolve_uri(config.tracking.uri))  # before any job starts, whatever the launcher
        except (TrackingUnavailable, ValueError) as e:
            # Hydra turns a callback's Exception into a warning and starts the jobs anyway: exit instead
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        mlflow.set_tracking_uri(uri)
        client = MlflowClient()
        exp = client.get_experiment_by_name(config.tracking.experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(
            config.tracking.experiment, artifact_location=artifact_location(uri))
        sweep = " ".join(config.hydra.overrides.task) if "hydra" in config else ""
        run = client.create_run(exp_id, run_name=f"sweep: {sweep}"[:250] or "sweep",
                                tags={"optladder.kind": "sweep", "sweep_dir": str(config.hydra.sweep.dir)})
        self.parent_run_id = run.info.run_id
        os.environ[PARENT_ENV] = self.parent_run_id  # launchers hand it to jobs in other processes
        # a failed job makes Hydra's sweeper raise before on_multirun_end: close the parent as FAILED then
        atexit.register(self._close, "FAILED")

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        if getattr(job_return, "status", None) == JobStatus.FAILED:
            self.failed += 1

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._close("FAILED" if self.failed else "FINISHED")

    def _close(self, status: str) -> None:
        if self.parent_run_id is None:
            return
        from mlflow.tracking import MlflowClient

        MlflowClient().set_terminated(self.parent_run_id, status=status)
        self.parent_run_id = None
        os.environ.pop(PARENT_ENV, None)
