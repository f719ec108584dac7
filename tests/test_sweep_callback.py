"""A Hydra multirun as one MLflow parent run with a child per job (optladder/experiments/callbacks.py), driven through
the callback's hooks as Hydra calls them; a real `-m` sweep runs in test_cli.py."""
from __future__ import annotations

import os

import mlflow
from hydra.core.utils import JobReturn, JobStatus
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from optladder.experiments.callbacks import MLflowSweepCallback
from optladder.experiments.tracking import PARENT_ENV


def sweep_config(uri: str, enabled: bool = True):
    return OmegaConf.create({"tracking": {"enabled": enabled, "uri": uri, "experiment": "optladder",
                                          "artifact_location": None},
                             "hydra": {"overrides": {"task": ["seed=1,2"]}, "sweep": {"dir": "/tmp/sweep"}}})


def job(status: JobStatus) -> JobReturn:
    ret = JobReturn()
    ret.status = status
    return ret


def sweep(uri: str, *statuses: JobStatus) -> str:
    cfg, cb = sweep_config(uri), MLflowSweepCallback()
    cb.on_multirun_start(cfg)
    parent = cb.parent_run_id
    assert parent and os.environ[PARENT_ENV] == parent  # each job's Tracker nests under it
    for status in statuses:
        cb.on_job_end(cfg, job(status))
    cb.on_multirun_end(cfg)
    assert PARENT_ENV not in os.environ and cb.parent_run_id is None  # closed once (not again at exit)
    return parent


def test_the_parent_run_fails_when_any_job_failed(tmp_path, monkeypatch):
    monkeypatch.delenv(PARENT_ENV, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # one database for both sweeps: creating one takes seconds
    failed = sweep(uri, JobStatus.COMPLETED, JobStatus.FAILED)
    finished = sweep(uri, JobStatus.COMPLETED, JobStatus.COMPLETED)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    assert client.get_run(failed).info.status == "FAILED"
    run = client.get_run(finished)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "sweep: seed=1,2" and run.data.tags["optladder.kind"] == "sweep"


def test_no_tracking_no_parent_run(tmp_path, monkeypatch):
    monkeypatch.delenv(PARENT_ENV, raising=False)
    cfg, cb = sweep_config(f"sqlite:///{tmp_path / 'mlflow.db'}", enabled=False), MLflowSweepCallback()
    cb.on_multirun_start(cfg)
    cb.on_multirun_end(cfg)
    assert cb.parent_run_id is None and PARENT_ENV not in os.environ
    assert not (tmp_path / "mlflow.db").exists()


def test_a_sweep_job_s_ladder_counts_as_ran_only_once_it_ended(tmp_path):
    """A ladder writes ladder.json after every rung (`complete: false` until the end): a job killed mid-ladder is
    listed as failed, with its error, not as ran."""
    import json

    from optladder.experiments.callbacks import _job_status

    out = tmp_path / "job"
    out.mkdir()
    (out / "error.txt").write_text("Terminated: signal 15\n")
    (out / "ladder.json").write_text(json.dumps({"rungs": [{"rung": 0}], "complete": False}))
    assert _job_status(out) == "failed: Terminated: signal 15"
    (out / "ladder.json").write_text(json.dumps({"rungs": [{"rung": 0}], "complete": True}))
    assert _job_status(out) == "ran"
    (out / "ladder.json").write_text(json.dumps({"rungs": [{"rung": 0}]}))  # written before the field existed
    assert _job_status(out) == "ran"
