"""One MLflow tracking server (make mlflow-server): checks made before anything starts, and several jobs
logging at once through a real server on SQLite and on a real PostgreSQL, losing nothing."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import time

import pytest

from optladder.experiments.schema import TrackingConfig
from optladder.paths import PROJECT_ROOT
from optladder.experiments.tracking import artifact_location
from optladder.experiments.tracking_server import TrackingUnavailable, check_driver, check_server, check_uri, redact
from tests.services import ROOT, free_port, mlflow_server, postgres_bin, postgres_cluster

pytestmark = pytest.mark.e2e  # processes of their own: the command, a server, a shell script

JOBS, STEPS = 3, 60
# one process per job, all at once: a child run under one parent, per-step metrics, params, tags, an artifact
WORKER = textwrap.dedent("""
    import sys, tempfile, pathlib, mlflow
    uri, parent, job = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("concurrency")
    with mlflow.start_run(run_name=f"job{job}", parent_run_id=parent, nested=True):
        mlflow.log_params({f"p{i}": f"{job}-{i}" for i in range(20)})
        mlflow.set_tags({"job": str(job)})
        for step in range(%d):
            mlflow.log_metric("perf/x", job * 1000 + step, step=step)
        d = pathlib.Path(tempfile.mkdtemp()); (d / "records.jsonl").write_text("x" * 10000 + str(job))
        mlflow.log_artifact(str(d / "records.jsonl"))
""" % STEPS)


def test_a_server_that_is_down_is_named_with_the_fix():
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(TrackingUnavailable, match="make mlflow-server") as e:
        check_uri(uri)
    assert uri in str(e.value) and time.monotonic() - t0 < 10  # one probe, not MLflow's minutes of retries


def test_a_sweep_against_a_server_that_is_down_stops_before_any_job(tmp_path):
    sweep = tmp_path / "sweep"
    p = subprocess.run([sys.executable, "run.py", "-m", "model=tiny", "seed=1,2", f"hydra.sweep.dir={sweep}",
                        f"tracking.uri=http://127.0.0.1:{free_port()}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode != 0 and "no MLflow tracking server answers" in p.stderr
    assert not (sweep / "0").exists()  # no job started


def test_a_database_uri_without_its_driver_names_the_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install 'psycopg\[binary\]'") as e:
        check_driver("postgresql+psycopg://mlflow:s3cret@db:5432/mlflow")
    assert "s3cret" not in str(e.value) and "mlflow:***@db" in str(e.value)
    check_driver("sqlite:///mlflow.db")  # no driver to check


def test_artifacts_go_through_a_server_beside_sqlite_and_to_the_project_folder_otherwise():
    def where(uri: str, **kw) -> str | None:
        return artifact_location(TrackingConfig(uri=uri, **kw))

    assert where("http://127.0.0.1:5000") is None  # the server's proxied store, from any host
    assert where("sqlite:////tmp/x/m.db") == "file:///tmp/x/mlartifacts"
    assert where("postgresql+psycopg://u@h/db") == (PROJECT_ROOT / "mlartifacts").as_uri()
    assert where("http://127.0.0.1:5000", artifact_location="s3://b/p") == "s3://b/p"
    assert redact("postgresql://u:pw@h/db") == "postgresql://u:***@h/db" and redact("sqlite:///a.db") == "sqlite:///a.db"


def _log_concurrently(uri: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("concurrency") or client.get_experiment(client.create_experiment("concurrency"))
    parent = client.create_run(exp.experiment_id, run_name="sweep").info.run_id
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, uri, parent, str(j)], stderr=subprocess.PIPE, text=True)
             for j in range(JOBS)]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()[-2000:]
    client.set_terminated(parent)
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(c.data.tags["job"] for c in children) == [str(j) for j in range(JOBS)]
    for c in children:
        job = int(c.data.tags["job"])
        assert c.info.status == "FINISHED" and len(c.data.params) == 20
        history = client.get_metric_history(c.info.run_id, "perf/x")
        assert sorted((m.step, m.value) for m in history) == [(s, job * 1000 + s) for s in range(STEPS)]
        assert [a.path for a in client.list_artifacts(c.info.run_id)] == ["records.jsonl"]


def test_several_jobs_logging_at_once_through_a_sqlite_server_lose_nothing(mlflow_server_uri):
    check_server(mlflow_server_uri)
    _log_concurrently(mlflow_server_uri)


@pytest.mark.postgres
@pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL not installed (.ci/run installs Debian's postgresql)")
def test_several_jobs_logging_at_once_through_a_postgresql_server_lose_nothing(tmp_path):
    with postgres_cluster() as db, mlflow_server(db, tmp_path / "artifacts", workers=1) as uri:
        _log_concurrently(uri)
        out = subprocess.run([str(postgres_bin() / "psql"), db.replace("+psycopg", ""), "-tAc",
                              "select count(*) from metrics"], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == str(JOBS * STEPS)  # the rows are in PostgreSQL itself
