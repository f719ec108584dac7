"""A Hydra multirun becomes one MLflow parent run with a child run per job."""
from __future__ import annotations

import logging
import os
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

        from experiments.snapshot import PROJECT_ROOT

        mlflow.set_tracking_uri(resolve_uri(config.tracking.uri))
        client = MlflowClient()
        try:
            exp = client.get_experiment_by_name(config.tracking.experiment)
            exp_id = exp.experiment_id if exp else client.create_experiment(
                config.tracking.experiment, artifact_location=(PROJECT_ROOT / "mlartifacts").as_uri())
            sweep = " ".join(config.hydra.overrides.task) if "hydra" in config else ""
            run = client.create_run(exp_id, run_name=f"sweep: {sweep}"[:250] or "sweep",
                                    tags={"optladder.kind": "sweep", "sweep_dir": str(config.hydra.sweep.dir)})
        except Exception as e:  # noqa: BLE001 - before any job: say so and stop (experiments/lifecycle.py)
            logging.getLogger("optladder").error("tracking.uri=%s: the MLflow store is unreachable (%s: %s); start "
                                                 "it or fix tracking.uri, or run with tracking.enabled=false",
                                                 config.tracking.uri, type(e).__name__, str(e)[:300])
            raise SystemExit(EXIT_TRACKING) from None
        self.parent_run_id = run.info.run_id
        os.environ[PARENT_ENV] = self.parent_run_id

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
        if self.parent_run_id is None:
            return
        from mlflow.tracking import MlflowClient

        MlflowClient().set_terminated(self.parent_run_id, status="FAILED" if self.failed else "FINISHED")
        os.environ.pop(PARENT_ENV, None)
