"""MLflow at the edge: one run per experiment, params from the flattened config, the metric names of
docs/design.md, tags, dataset inputs (the workload and the prompt set, by file and digest), and the run
directory's files as artifacts. `enabled: false` keeps everything local.

A store that cannot be reached when a run starts stops it before anything expensive (TrackingUnreachable,
exit status 69). A store lost mid-run is reported once; the run goes on and keeps everything in its run
directory, and the process ends with status 69 (`LOST` holds why). HTTP stores get few, short retries, so
neither case waits minutes on MLflow's default backoff."""
from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path

from optladder.backends.launcher import Terminated, raise_if_terminated, terminated
from optladder.paths import PROJECT_ROOT
from optladder.experiments.tracking_server import check_driver, check_uri, is_server, redact

log = logging.getLogger(__name__)
PARENT_ENV = "OPTLADDER_PARENT_RUN_ID"
LOST: list[str] = []  # why tracking was lost mid-run, by any Tracker of this process (run.py's exit status)
_HTTP_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def run_status(exc: BaseException | None) -> str:
    """The MLflow status of a run that ended with exc (None: it finished)."""
    if exc is None:
        return "FINISHED"
    # a SIGTERM whose exception a library lost on its way up ended it all the same
    return "KILLED" if isinstance(exc, (KeyboardInterrupt, Terminated)) or terminated() else "FAILED"


class TrackingUnreachable(RuntimeError):
    """The MLflow store could not be reached when the run started: nothing was run."""


def resolve_uri(uri: str) -> str:
    """sqlite:///relative.db is taken from the project root, so every run lands in one database."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str(PROJECT_ROOT / uri[len(prefix):])
    return uri


def artifact_location(cfg) -> str | None:
    """Where a new experiment keeps its artifacts: tracking.artifact_location if set; through a tracking server,
    the server's own store (None: uploaded over HTTP, so a job on another host never writes to a local path
    there); beside the database for a SQLite store (the project's mlartifacts/ for the default one); else the
    project's mlartifacts/."""
    if cfg.artifact_location:
        return cfg.artifact_location
    uri = resolve_uri(cfg.uri)
    if is_server(uri):
        return None
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    return (PROJECT_ROOT / "mlartifacts").as_uri()


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


def _reason(e: BaseException) -> str:
    """The root cause in one line (MLflow wraps the database's or the connection's own error)."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


class Tracker:
    """One MLflow run as a context manager, so the experiment code reads the same with tracking on or off and
    every exit path ends the run: on leaving the block the run directory's files become the run's artifacts
    (with error.txt, the traceback, when the block raised) and the run is marked FINISHED or FAILED.

        with Tracker(cfg.tracking, "name", tags, run_dir=run_dir) as tracker:
            tracker.log_metrics(...)
    """

    def __init__(self, cfg, run_name: str, tags: dict[str, str], parent_run_id: str | None = None,
                 run_dir: Path | None = None):
        self.cfg, self.tags, self.parent_run_id = cfg, tags, parent_run_id
        self.run_name = cfg.run_name or run_name
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.enabled = cfg.enabled and not LOST  # a store already lost in this process stays lost
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
            self.end(run_status(exc))  # FINISHED, FAILED, or KILLED for SIGINT / SIGTERM
        return False  # the exception, if any, goes on

    def _start(self) -> None:
        import mlflow

        cfg = self.cfg
        self.mlflow = mlflow
        uri = resolve_uri(cfg.uri)
        if is_server(uri):
            for k, v in _HTTP_RETRIES.items():
                os.environ.setdefault(k, v)
        if not is_server(uri):
            check_driver(uri)  # a missing database driver is a setting to fix (ValueError), not an outage
        try:
            check_uri(uri)  # a server that is down fails here, in one probe, before weights load
            mlflow.set_tracking_uri(uri)
            ensure_experiment(mlflow.tracking.MlflowClient(), cfg)
            mlflow.set_experiment(cfg.experiment)
            if cfg.system_metrics:
                mlflow.set_system_metrics_sampling_interval(cfg.system_metrics_interval_s)
            parent = self.parent_run_id or os.environ.get(PARENT_ENV)
            run = mlflow.start_run(run_name=self.run_name, tags=self.tags, parent_run_id=parent,
                                   log_system_metrics=cfg.system_metrics, nested=bool(parent))
        except Exception as e:  # noqa: BLE001 - whatever the store's client raises, the answer is the same
            raise TrackingUnreachable(f"tracking.uri={redact(cfg.uri)}: the MLflow store is unreachable "
                                      f"({_reason(e)}); start it or fix tracking.uri, or run with "
                                      "tracking.enabled=false") from None
        self.run_id = run.info.run_id

    def _call(self, what: str, call) -> None:
        """One call to the store; the first failure turns tracking off for this run, said once, loudly."""
        if not self.enabled:
            return
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the run's own results must not die with the store
            raise_if_terminated(e)  # a SIGTERM lost inside the client: the run ends, not tracking
            self.enabled = False
            LOST.append(f"{what}: {_reason(e)}")
            log.error("tracking lost mid-run (%s). The run goes on and keeps everything in its run directory; "
                      "it will end with exit status 69", LOST[-1])

    def log_params(self, params: dict[str, str]) -> None:
        items = list(params.items())
        for i in range(0, len(items), 100):
            self._call("log_params", lambda i=i: self.mlflow.log_params(dict(items[i:i + 100])))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if metrics:
            self._call("log_metrics", lambda: self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()},
                                                                      step=step))

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
            self._call("log_batch", lambda i=i: client.log_batch(self.run_id, metrics=points[i:i + 1000]))

    def set_tags(self, tags: dict[str, str]) -> None:
        self._call("set_tags", lambda: self.mlflow.set_tags(tags))

    def log_dataset(self, name: str, source: str, digest: str, context: str) -> None:
        """One dataset input of the run (MLflow's Datasets panel): `name`, read from the file `source`, `digest`
        identifying exactly what was used (MLflow keeps 36 characters of it), `context` what for. Metadata only:
        the file is not uploaded. A failure is logged and the run goes on with tracking on: a dataset record is
        not worth a run, and a store that is really gone fails the next call."""
        if not self.enabled:
            return
        try:
            from mlflow.data.dataset_source_registry import resolve_dataset_source
            from mlflow.data.meta_dataset import MetaDataset

            dataset = MetaDataset(resolve_dataset_source(source), name=name, digest=digest[:36])
            self.mlflow.log_input(dataset, context=context)
        except Exception as e:  # noqa: BLE001 - whatever MLflow raises, the run's own results come first
            raise_if_terminated(e)
            log.warning("MLflow did not record the dataset input %s (%s); the run goes on", name, _reason(e))

    def log_artifacts(self, run_dir: Path) -> None:
        self._call("log_artifacts", lambda: self.mlflow.log_artifacts(str(run_dir)))

    def log_artifact(self, path: Path) -> None:
        self._call("log_artifact", lambda: self.mlflow.log_artifact(str(path)))

    def end(self, ok: bool | str) -> None:
        """ok: True (FINISHED), False (FAILED), or an MLflow status: FINISHED, FAILED, KILLED."""
        if not self.run_id:
            return
        status = ok if isinstance(ok, str) else ("FINISHED" if ok else "FAILED")
        run_id, self.run_id = self.run_id, None  # ended once: the context manager's exit does nothing more
        if self.enabled:
            self._call("end_run", lambda: self.mlflow.end_run(status=status))
            return
        try:  # lost mid-run: one last try, in case the store is back; never an error of its own
            self.mlflow.end_run(status="FAILED")
        except Exception:  # noqa: BLE001
            log.warning("MLflow run %s could not be ended: it stays RUNNING in the store", run_id)
