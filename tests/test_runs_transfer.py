"""Runs made on another machine come home (optladder/experiments/runs_transfer.py over mlflow-export-import): a ladder-like
parent with a finished and a killed child, metric histories and artifacts, exported from one SQLite store and
imported into another, arrive nested with their statuses, params, metrics and files; a second import adds
nothing; a folder that is not an export is refused by name."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlflow_export_import")
from mlflow.tracking import MlflowClient  # noqa: E402

from optladder.experiments.runs_transfer import SOURCE_TAG, import_runs  # noqa: E402

pytestmark = pytest.mark.e2e  # processes of their own: the command, a server, a shell script

ROOT = Path(__file__).resolve().parents[1]


def make_source(tmp: Path) -> tuple[str, dict]:
    uri = f"sqlite:///{tmp / 'gpu' / 'mlflow.db'}"
    (tmp / "gpu").mkdir()
    client = MlflowClient(uri)
    exp = client.create_experiment("optladder", (tmp / "gpu" / "mlartifacts").as_uri())
    parent = client.create_run(exp, run_name="ladder", tags={"optladder.kind": "ladder"})
    kids = {}
    for name, status in (("rung-0-baseline", "FINISHED"), ("rung-1-paged_kv", "KILLED")):
        run = client.create_run(exp, run_name=name, tags={"mlflow.parentRunId": parent.info.run_id})
        client.log_param(run.info.run_id, "engine.paged_kv", str(name.endswith("paged_kv")))
        for step, v in enumerate([10.0, 12.5, 11.0]):
            client.log_metric(run.info.run_id, "perf/ttft_ms_p50", v + len(name), step=step)
        art = tmp / name
        art.mkdir()
        (art / "summary.json").write_text(f'{{"rung": "{name}"}}')
        client.log_artifacts(run.info.run_id, str(art))
        client.set_terminated(run.info.run_id, status)
        kids[name] = run.info.run_id
    client.log_metric(parent.info.run_id, "ladder/rungs_passed", 1)
    client.set_terminated(parent.info.run_id, "FINISHED")
    return uri, {"parent": parent.info.run_id, **kids}


def export(src_uri: str, out: Path) -> None:
    """`python -m optladder.experiments.runs_transfer export`, as the GPU host runs it."""
    p = subprocess.run([sys.executable, "-m", "optladder.experiments.runs_transfer", "export", "--uri", src_uri,
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "3 run(s)" in p.stdout


def test_runs_arrive_nested_with_status_metrics_and_files_and_a_second_import_adds_nothing(tmp_path):
    src_uri, ids = make_source(tmp_path)
    out = tmp_path / "export"
    export(src_uri, out)

    dst_uri = f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}"
    (tmp_path / "home").mkdir()
    MlflowClient(dst_uri).create_experiment("optladder", (tmp_path / "home" / "mlartifacts").as_uri())
    report = import_runs(out, dst_uri)
    assert report == [{"experiment": "optladder", "runs": 3, "imported": 3, "already_there": 0}]

    client = MlflowClient(dst_uri)
    exp = client.get_experiment_by_name("optladder")
    runs = {r.data.tags[SOURCE_TAG]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == set(ids.values())
    parent = runs[ids["parent"]]
    assert parent.info.run_id != ids["parent"]  # a new run in the new store
    assert "mlflow.parentRunId" not in parent.data.tags and parent.data.metrics["ladder/rungs_passed"] == 1
    for name in ("rung-0-baseline", "rung-1-paged_kv"):
        kid = runs[ids[name]]
        assert kid.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert kid.info.run_name == name
        history = [m.value for m in client.get_metric_history(kid.info.run_id, "perf/ttft_ms_p50")]
        assert history == [v + len(name) for v in (10.0, 12.5, 11.0)]
        local = client.download_artifacts(kid.info.run_id, "summary.json", str(tmp_path / f"dl-{name}"))
        assert name in Path(local).read_text()
    assert runs[ids["rung-0-baseline"]].info.status == "FINISHED"
    assert runs[ids["rung-1-paged_kv"]].info.status == "KILLED"  # the tool alone would say FINISHED
    src = MlflowClient(src_uri)
    for src_id, run in runs.items():  # the tool alone starts every run at the import
        want = src.get_run(src_id).info
        assert (run.info.start_time, run.info.end_time) == (want.start_time, want.end_time)

    again = import_runs(out, dst_uri)
    assert again == [{"experiment": "optladder", "runs": 3, "imported": 0, "already_there": 3}]
    assert len(client.search_runs([exp.experiment_id])) == 3

    # an import cut short after the tool made the run, before ours marked it: imported again, the stub set aside
    cut = runs[ids["rung-1-paged_kv"]].info.run_id
    client.delete_tag(cut, SOURCE_TAG)
    client.set_terminated(cut, "FINISHED")
    third = import_runs(out, dst_uri)
    assert third == [{"experiment": "optladder", "runs": 3, "imported": 1, "already_there": 2}]
    live = {r.data.tags[SOURCE_TAG]: r for r in client.search_runs([exp.experiment_id])}
    assert len(live) == 3 and cut not in {r.info.run_id for r in live.values()}
    assert live[ids["rung-1-paged_kv"]].info.status == "KILLED"
    assert client.get_run(cut).info.lifecycle_stage == "deleted"


def test_a_folder_that_is_not_an_export_is_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match="no experiments.json"):
        import_runs(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_an_export_travels_as_a_gzipped_tar_and_a_broken_or_missing_one_is_refused(tmp_path):
    import tarfile

    src_uri, ids = make_source(tmp_path)
    out = tmp_path / "mlflow-export"
    export(src_uri, out)
    archive = tmp_path / "mlflow-export.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out, arcname="mlflow-export")
    dst_uri = f"sqlite:///{tmp_path / 'home.db'}"
    p = subprocess.run([sys.executable, "-m", "optladder.experiments.runs_transfer", "import", str(archive), "--to", dst_uri],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "3 run(s) imported, 0 already there" in p.stdout
    client = MlflowClient(dst_uri)
    exp = client.get_experiment_by_name("optladder")
    got = {r.data.tags[SOURCE_TAG]: r for r in client.search_runs([exp.experiment_id])}
    assert set(got) == set(ids.values())
    kid = got[ids["rung-0-baseline"]]
    local = client.download_artifacts(kid.info.run_id, "summary.json", str(tmp_path / "dl"))
    assert "rung-0-baseline" in Path(local).read_text()  # the files came out of the archive, not a temp left behind
    assert import_runs(archive, dst_uri) == [{"experiment": "optladder", "runs": 3, "imported": 0, "already_there": 3}]

    broken = tmp_path / "broken.tgz"
    broken.write_bytes(archive.read_bytes()[:200])
    with pytest.raises(SystemExit, match="not a readable gzipped tar"):
        import_runs(broken, dst_uri)
    with pytest.raises(SystemExit, match="no such folder or .tgz or .tar.gz archive"):
        import_runs(tmp_path / "nowhere.tgz", dst_uri)
    with pytest.raises(SystemExit, match="not a folder, nor a .tgz"):
        import_runs(broken.rename(tmp_path / "export.zip"), dst_uri)
    nested = tmp_path / "nested.tar.gz"  # an export under a deeper path in the archive is found
    with tarfile.open(nested, "w:gz") as tar:
        tar.add(out, arcname="benchmarks/results/x/mlflow-export")
    assert import_runs(nested, dst_uri) == [{"experiment": "optladder", "runs": 3, "imported": 0, "already_there": 3}]
    empty = tmp_path / "empty.tgz"
    with tarfile.open(empty, "w:gz") as tar:
        tar.add(tmp_path / "dl", arcname="dl")
    with pytest.raises(SystemExit, match="holds 0 exports"):
        import_runs(empty, dst_uri)
