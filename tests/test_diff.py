"""The snapshot diff names exactly what changed between two runs."""
import json

from optladder.experiments.diff import main
from optladder.experiments.snapshot import build_snapshot, write_snapshot


def make_run(path, engine_cfg, torch_version, ttft):
    path.mkdir()
    snap = build_snapshot({"engine": engine_cfg, "model": {"name": "tiny"}}, ["+opt=x"], {})
    snap["environment"]["packages"]["torch"] = torch_version
    snap["requests_digest"] = "abc"
    write_snapshot(path, snap)
    (path / "summary.json").write_text(json.dumps({"metrics": {"perf/ttft_ms_p50": ttft}}))
    return path


def test_diff_prints_config_environment_and_metric_changes(tmp_path, capsys):
    a = make_run(tmp_path / "a", {"paged_kv": False, "block_size": 16}, "2.13.0", 100.0)
    b = make_run(tmp_path / "b", {"paged_kv": True, "block_size": 16}, "2.14.1", 80.0)
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "engine.paged_kv: False  ->  True" in out
    assert "block_size" not in out  # unchanged keys are not listed
    assert "packages.torch: 2.13.0  ->  2.14.1" in out
    assert "perf/ttft_ms_p50: 100.0  ->  80.0  (-20.0%)" in out
    assert "## digests: 0 difference(s)" in out


def test_diff_of_unknown_run_is_a_clear_error(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main([str(tmp_path), "nope", "--tracking-uri", uri]) == 2
    assert "not an optladder run directory" in capsys.readouterr().err
