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
