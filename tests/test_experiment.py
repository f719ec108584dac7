"""One experiment end to end on the tiny model: the files it leaves, the MLflow run it logs, and what a
run that dies halfway keeps."""
import json

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from optladder.experiments.experiment import run_experiment
from optladder.experiments.snapshot import SNAPSHOT_FILE
from tests.conftest import compose_config
from optladder.traffic.metrics import compute_metrics
from optladder.traffic.request import RequestRecord


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cfg = compose_config([f"tracking.uri={uri}", "+opt=batched_decode"])
    result = run_experiment(cfg, tmp / "out", overrides=["+opt=batched_decode"], choices={"opt": "batched_decode"})
    return result, uri


def test_summary_holds_the_contract(finished):
    result, _ = finished
    s = json.loads((result.run_dir / "summary.json").read_text())
    assert s["run_id"] == result.run_id and s["run_id"]
    assert s["opts"] == ["batched_decode"]
    assert s["opts_effective"]["batched_decode"]["on"] is True
    assert s["opts_effective"]["batched_decode"]["host_copies_per_step"] == 1.0
    assert s["opts_effective"]["paged_kv"]["on"] is False
    m = s["metrics"]
    for name in ("perf/ttft_ms_p50", "perf/tpot_ms_p99", "perf/itl_ms_mean", "perf/e2e_ms_p999",
                 "perf/throughput_req_s", "perf/throughput_out_tok_s", "perf/goodput_req_s", "perf/peak_mem_gb",
                 "perf/kv_reserved_gb", "perf/kv_used_gb", "perf/kv_util", "perf/lateness_ms_p99",
                 "perf/requests_ok", "perf/requests_failed", "perf/load_s", "perf/start_s",
                 "quality/bleu_vs_ref", "quality/rouge1_vs_ref", "quality/rouge2_vs_ref", "quality/rougeL_vs_ref",
                 "stage/decode_ms_mean", "stage/decode_ms_std", "stage/prefill_ms_mean", "stage/sample_ms_mean",
                 "stage/detokenize_ms_mean", "stage/schedule_ms_mean"):
        assert name in m, name
    assert m["perf/requests_ok"] == 6 and m["perf/requests_failed"] == 0
    assert 0 < m["perf/kv_util"] <= 1


def test_requests_jsonl_recomputes_the_logged_metrics(finished):
    result, _ = finished
    lines = (result.run_dir / "requests.jsonl").read_text().splitlines()
    records = [RequestRecord.from_dict(json.loads(x)) for x in lines]
    assert len(records) == 6 and all(r.ok for r in records)
    assert all(r.output_tokens == r.requested_output_tokens for r in records)  # exact lengths, EOS ignored
    again = compute_metrics(records)
    for k in ("perf/ttft_ms_p50", "perf/e2e_ms_p99", "perf/throughput_out_tok_s"):
        assert again[k] == pytest.approx(result.metrics[k])


def test_quality_outputs_file(finished):
    result, _ = finished
    rows = [json.loads(x) for x in (result.run_dir / "quality_outputs.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row, out in zip(rows, result.outputs):
        assert {"id", "prompt", "output", "references"} <= set(row)
        assert row["output"] == out and row["references"]


def test_snapshot_has_config_environment_and_digests(finished):
    result, _ = finished
    snap = json.loads((result.run_dir / SNAPSHOT_FILE).read_text())
    assert snap["resolved_config"]["engine"]["batched_decode"] is True
    assert snap["resolved_config"]["model"]["name"] == "tiny"
    assert snap["overrides"] == ["+opt=batched_decode"]
    env = snap["environment"]
    assert env["python"] and "torch" in env["packages"] and "transformers" in env["packages"]
    assert "git_commit" in env and "git_dirty" in env
    assert snap["requests_digest"] == result.requests_digest and len(result.requests_digest) == 64
    assert snap["prompts_digest"] == result.prompts_digest


def test_mlflow_run_has_params_metrics_tags_artifacts(finished):
    result, uri = finished
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["engine.batched_decode"] == "True"
    assert run.data.params["model.name"] == "tiny"
    assert run.data.tags["engine"] == "reference" and run.data.tags["opts"] == "batched_decode"
    assert "git_commit" in run.data.tags
    assert run.data.metrics["perf/requests_ok"] == 6
    assert run.data.metrics["perf/ttft_ms_p50"] == pytest.approx(result.metrics["perf/ttft_ms_p50"])
    assert "quality/rougeL_vs_ref" in run.data.metrics
    names = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"summary.json", "requests.jsonl", "quality_outputs.jsonl", SNAPSHOT_FILE} <= names
    assert len(client.get_metric_history(result.run_id, "kv/reserved_gb")) > 1  # KV over time


def test_run_that_dies_halfway_is_failed_and_keeps_its_records(tmp_path, monkeypatch):
    from optladder.backends.engines import ReferenceBackend

    def crash(*args, **kwargs):
        raise RuntimeError("the quality phase crashed")

    # the replay succeeds, then the engine fails in the quality phase: the run dies after the replay
    monkeypatch.setattr(ReferenceBackend, "generate", crash)
    monkeypatch.setattr(ReferenceBackend, "generate_traced", crash)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_config([f"tracking.uri={uri}"])
    with pytest.raises(RuntimeError, match="quality phase crashed"):
        run_experiment(cfg, tmp_path / "out")
    lines = (tmp_path / "out" / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 6
    assert "quality phase crashed" in (tmp_path / "out" / "error.txt").read_text()
    mlflow.set_tracking_uri(uri)
    runs = MlflowClient().search_runs([MlflowClient().get_experiment_by_name("optladder").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "requests.jsonl" in {a.path for a in MlflowClient().list_artifacts(runs[0].info.run_id)}


def test_prompt_longer_than_max_model_len_is_rejected_and_counted(tmp_path):
    cfg = compose_config(["tracking.enabled=false", "engine.max_model_len=64", "quality.num_prompts=1",
                          "workload.input_len_range=[62,90]", "workload.output_len_range=[4,8]"])
    result = run_experiment(cfg, tmp_path / "out")
    # the workload fits requests to max_model_len (counted as changed lengths), nothing is truncated silently
    assert result.metrics["traffic/changed_lengths"] == 6  # every one: at least 62 + 4 tokens for 64
    assert all(r.input_tokens + r.requested_output_tokens <= 64 and r.ok for r in result.records)


@pytest.mark.parametrize("stop_early", [True, False])
def test_capacity_search_through_the_run_stops_a_probe_that_must_fail(tmp_path, stop_early):
    # an SLO no request can meet: the probe at concurrency 1 fails; stopped after its first request (a failure
    # of one request in 8 already puts P99 over the SLO) unless replay.capacity_stop_early=false
    cfg = compose_config(["tracking.enabled=false", "replay.capacity=true", "replay.capacity_requests=8", "replay.capacity_hi=8",
                          "slo.e2e_s=0.0001", f"replay.capacity_stop_early={str(stop_early).lower()}"])
    result = run_experiment(cfg, tmp_path / "out")
    cap = json.loads((tmp_path / "out" / "capacity.json").read_text())
    assert cap["value"] == 0 and len(cap["probes"]) == 1
    probe = cap["probes"][0]
    assert probe["requests"] == 8 and probe["seconds"] > 0 and probe["ok"] is False
    assert probe["failed"] == probe["stopped"] == (7 if stop_early else 0)  # the stopped ones count as failed
    assert result.metrics["capacity/max_concurrency"] == 0
    assert result.metrics["capacity/probes_stopped_early"] == float(stop_early)
    assert result.metrics["capacity/search_s"] == pytest.approx(probe["seconds"])
