"""MLflow at the edge: one run per experiment, params from the flattened config, the metric names of
DESIGN.md, tags, and the run directory's files as artifacts. `enabled: false` keeps everything local."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from experiments.snapshot import PROJECT_ROOT

log = logging.getLogger(__name__)
PARENT_ENV = "OPTLADDER_PARENT_RUN_ID"


def resolve_uri(uri: str) -> str:
    """sqlite:///relative.db is taken from the project root, so every run lands in one database."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str(PROJECT_ROOT / uri[len(prefix):])
    return uri


def artifact_location(cfg) -> str | None:
    """Where a new experiment keeps its artifacts: tracking.artifact_location if set; beside the database
    for a SQLite store (the project's own mlartifacts/ for the default one); else the tracking server's or
    MLflow's own default (None), so a shared server keeps artifacts where it serves them from."""
    if cfg.artifact_location:
        return cfg.artifact_location
    uri = resolve_uri(cfg.uri)
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    return None


KIND_TAG = "mlflow.experimentKind"  # so the UI opens on the runs table, not on the GenAI traces view


def ensure_experiment(client, cfg) -> str:
    """The experiment's id, created on first use with its artifact location."""
    exp = client.get_experiment_by_name(cfg.experiment)
    if exp is None:
        return client.create_experiment(cfg.experiment, artifact_location(cfg),
                                        tags={KIND_TAG: "custom_model_development"})
    if KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, KIND_TAG, "custom_model_development")
    return exp.experiment_id


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
    """A thin wrapper so the experiment code reads the same with tracking on or off."""

    def __init__(self, cfg, run_name: str, tags: dict[str, str], parent_run_id: str | None = None):
        self.enabled = cfg.enabled
        self.run_id: str | None = None
        self.run_name = cfg.run_name or run_name
        if not self.enabled:
            return
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(resolve_uri(cfg.uri))
        ensure_experiment(mlflow.tracking.MlflowClient(), cfg)
        mlflow.set_experiment(cfg.experiment)
        if cfg.system_metrics:
            mlflow.set_system_metrics_sampling_interval(cfg.system_metrics_interval_s)
        parent = parent_run_id or os.environ.get(PARENT_ENV)
        run = mlflow.start_run(run_name=self.run_name, tags=tags, parent_run_id=parent,
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

    def log_series(self, series: dict[str, list[float]], steps: list[int] | None = None,
                   timestamps_ms: list[int] | None = None) -> None:
        """Curves in batches (one database write per 1000 points, not per point). steps: one per value
        (default 0, 1, ...); timestamps_ms: when each value was measured (default now)."""
        if not self.enabled or not series:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [Metric(k, float(v), timestamps_ms[i] if timestamps_ms else now, steps[i] if steps else i)
                  for k, vs in series.items() for i, v in enumerate(vs)]
        client = self.mlflow.tracking.MlflowClient()
        for i in range(0, len(points), 1000):
            client.log_batch(self.run_id, metrics=points[i:i + 1000])

    def set_tags(self, tags: dict[str, str]) -> None:
        if self.enabled:
            self.mlflow.set_tags(tags)

    def log_artifacts(self, run_dir: Path) -> None:
        if self.enabled:
            self.mlflow.log_artifacts(str(run_dir))

    def end(self, ok: bool, status: str | None = None) -> None:
        """FINISHED or FAILED by `ok`; `status` another of MLflow's (KILLED: a sweep job skipped)."""
        if self.enabled and self.run_id:
            self.mlflow.end_run(status=status or ("FINISHED" if ok else "FAILED"))
