"""The Tracker as a context manager: every way out of the block ends the run, and a block that raised leaves
its traceback in the run directory (an MLflow run's FAILED status: test_experiment.py)."""
from __future__ import annotations

import pytest

from optladder.experiments.schema import TrackingConfig
from optladder.experiments.tracking import Tracker, flatten, resolve_uri


def test_a_block_that_raises_leaves_its_traceback_and_the_error_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="device lost"):
        with Tracker(TrackingConfig(enabled=False), "x", {}, run_dir=run_dir) as tracker:
            assert tracker.run_id is None  # untracked: the code reads the same, nothing is logged
            raise RuntimeError("device lost")
    text = (run_dir / "error.txt").read_text()
    assert text.startswith("Traceback") and "RuntimeError: device lost" in text


def test_a_block_that_finishes_leaves_no_error(tmp_path):
    with Tracker(TrackingConfig(enabled=False), "x", {}, run_dir=tmp_path) as tracker:
        tracker.log_metrics({"perf/x": 1.0})
        tracker.log_params({"a": "1"})
    assert not (tmp_path / "error.txt").exists()


def test_params_are_flattened_and_uris_anchored():
    assert flatten({"engine": {"paged_kv": True, "server": {"env": {}}}, "seed": 0, "long": "x" * 7000}) == {
        "engine.paged_kv": "True", "engine.server.env": "{}", "seed": "0", "long": "x" * 6000}
    assert resolve_uri("sqlite:////abs/mlflow.db") == "sqlite:////abs/mlflow.db"
    assert resolve_uri("http://mlflow:5000") == "http://mlflow:5000"


def _log_a_run(uri: str, tmp_path, *overrides) -> str:
    """The opening of run_experiment (tags, name, dataset inputs) for a config, without the replay."""
    from optladder.experiments.build import build
    from optladder.experiments.preflight import prepare
    from optladder.experiments.run_views import dataset_inputs, run_name, run_tags
    from tests.conftest import compose_config

    conf = build(compose_config([f"tracking.uri={uri}", "quality.num_prompts=3", *overrides]))
    prepared = prepare(conf)
    tags = run_tags(conf, [], {}, prepared.workload.stats)
    with Tracker(conf.tracking, run_name(conf, [], tags), tags) as tracker:
        for dataset in dataset_inputs(conf, prepared):
            tracker.log_dataset(**dataset)
        return tracker.run_id


def test_runs_differing_only_in_seed_or_prompt_file_are_told_apart_in_the_store(tmp_path):
    import json

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rows = [{"id": f"q{i}", "prompt": f"Say {i}.", "references": [str(i)]} for i in range(3)]
    files = []
    for name in ("mine.jsonl", "theirs.jsonl"):
        files.append(tmp_path / name)
        files[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = [_log_a_run(uri, tmp_path, "quality=jsonl", f"quality.path={f}", f"seed={s}")
           for f, s in ((files[0], 0), (files[0], 1), (files[1], 0))]
    client = MlflowClient(uri)
    runs = [client.get_run(i) for i in ids]
    assert [r.info.run_name for r in runs] == ["reference:baseline:tiny quality=mine",
                                              "reference:baseline:tiny quality=mine seed=1",
                                              "reference:baseline:tiny quality=theirs"]
    for run, f in zip(runs, (files[0], files[0], files[1])):
        inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
        assert set(inputs) == {"builtin", f.stem}
        assert json.loads(inputs[f.stem].source) == {"uri": str(f.resolve())}
        assert inputs[f.stem].source_type == "local"
    # the same file, two seeds: the prompts are the same, the requests replayed are not
    (a, b) = ({d.dataset.name: d.dataset.digest for d in r.inputs.dataset_inputs} for r in runs[:2])
    assert a["mine"] == b["mine"] and a["builtin"] != b["builtin"]


def test_a_dataset_input_mlflow_refuses_does_not_stop_the_run(tmp_path, monkeypatch, caplog):
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def refuse(*a, **k):
        raise RuntimeError("store said no")

    monkeypatch.setattr(mlflow, "log_input", refuse)
    with Tracker(TrackingConfig(uri=uri), "x", {}, run_dir=tmp_path / "run") as tracker:
        tracker.log_dataset("mine", str(tmp_path), "ab" * 40, "quality")
        assert tracker.enabled  # tracking goes on
        tracker.log_metrics({"perf/x": 1.0})
        run_id = tracker.run_id
    assert "did not record the dataset input mine (RuntimeError: store said no)" in caplog.text
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics == {"perf/x": 1.0}
    with Tracker(TrackingConfig(enabled=False), "x", {}) as off:
        off.log_dataset("mine", str(tmp_path), "ab", "quality")  # tracking off: nothing, and no error
