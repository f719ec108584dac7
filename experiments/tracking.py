"""MLflow at the edge: one run per experiment, params from the flattened config, the metric names of
DESIGN.md, tags, and the run directory's files as artifacts. `enabled: false` keeps everything local."""
from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path

from experiments.snapshot import PROJECT_ROOT
from experiments.tracking_server import artifact_location, check_uri

log = logging.getLogger(__name__)
PARENT_ENV = "OPTLADDER_PARENT_RUN_ID"


def resolve_uri(uri: str) -> str:
    """sqlite:///relative.db is taken from the project root, so every run lands in one database."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str(PROJECT_ROOT / uri[len(prefix):])
    return uri


def flatten(d, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:6000]
    return out


class Tracker:
    """One MLflow run as a context manager, so the experiment code reads the same with tracking on or off and
    every exit path ends the run: on leaving the block the run directory's files become the run's artifacts
    (with error.txt, the traceback, when the block raised) and the run is marked FINISHED or FAILED.

        with Tracker(cfg.tracking, "name", tags, run_dir=run_dir) as tracker:
            tracker.log_metrics(...)
    """

    def __init__(self, cfg, run_name: str, tags: dict[str, str], parent_run_id: str | None = None,
                 run_dir: Path | None = None):
        self.cfg, self.run_name, self.tags, self.parent_run_id = cfg, run_name, tags, parent_run_id
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.enabled = cfg.enabled
        self.run_id: str | None = None

    def __enter__(self) -> "Tracker":
        if self.enabled:
            self._start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if self.run_dir is not None:
                if exc_type is not None:
                    self.run_dir.mkdir(parents=True, exist_ok=True)
                    (self.run_dir / "error.txt").write_text("".join(traceback.format_exception(exc_type, exc, tb)))
                self.log_artifacts(self.run_dir)
        finally:
            self.end(exc_type is None)
        return False  # the exception, if any, goes on

    def _start(self) -> None:
        import mlflow

        cfg = self.cfg
        self.mlflow = mlflow
        uri = check_uri(resolve_uri(cfg.uri))  # a server that is down fails here, before weights load
        mlflow.set_tracking_uri(uri)
        exp = mlflow.get_experiment_by_name(cfg.experiment)
        if exp is None:
            mlflow.create_experiment(cfg.experiment, artifact_location=artifact_location(uri))
        mlflow.set_experiment(cfg.experiment)
        if cfg.system_metrics:
            mlflow.set_system_metrics_sampling_interval(cfg.system_metrics_interval_s)
        parent = self.parent_run_id or os.environ.get(PARENT_ENV)
        run = mlflow.start_run(run_name=cfg.run_name or self.run_name, tags=self.tags, parent_run_id=parent,
                               log_system_metrics=cfg.system_metrics, nested=bool(parent))
        self.run_id = run.info.run_id

    def log_params(self, params: dict[str, str]) -> None:
        if self.enabled:
            items = list(params.items())
            for i in range(0, len(items), 100):
                self.mlflow.log_params(dict(items[i:i + 100]))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.enabled and metrics:
            self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_series(self, series: dict[str, list[float]]) -> None:
        """Curves (one value per step) in batches: one database write per 1000 points, not per point."""
        if not self.enabled or not series:
            return
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        points = [Metric(k, float(v), ts, i) for k, vs in series.items() for i, v in enumerate(vs)]
        client = self.mlflow.tracking.MlflowClient()
        for i in range(0, len(points), 1000):
            client.log_batch(self.run_id, metrics=points[i:i + 1000])

    def set_tags(self, tags: dict[str, str]) -> None:
        if self.enabled:
            self.mlflow.set_tags(tags)

    def log_artifacts(self, run_dir: Path) -> None:
        if self.enabled:
            self.mlflow.log_artifacts(str(run_dir))

    def end(self, ok: bool) -> None:
        if self.enabled and self.run_id:
            self.mlflow.end_run(status="FINISHED" if ok else "FAILED")
