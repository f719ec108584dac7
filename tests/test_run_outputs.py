"""What one run shows in MLflow and leaves on disk: its name and tags, KV curves over the replay only,
results.md, per-level metrics, the profiler's trace; and a broken prompt set stopping it before any engine."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from optladder.experiments.errors import UserError
from optladder.experiments.experiment import run_experiment
from optladder.experiments.report import fmt
from tests.conftest import ROOT, compose_config

CHAT = ROOT / "docs" / "examples" / "chat_prompts.jsonl"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("views")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cfg = compose_config([f"tracking.uri={uri}", "+profile=torch", "profile.steps=4", "replay.load_levels=[5,40]",
                          "quality=jsonl", f"quality.path={CHAT}", "quality.max_new_tokens=auto",
                          "quality.max_new_tokens_cap=12", "quality.num_prompts=5"])
    result = run_experiment(cfg, tmp / "out", tags={"sweep.seed": "3"})
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    return result, client, client.get_run(result.run_id), tmp


def test_name_and_tags_tell_sweep_jobs_apart(run):
    result, client, r, _ = run
    assert r.info.run_name == "reference:baseline:tiny quality=chat_prompts seed=3"  # the prompt set by its file
    tags = r.data.tags
    assert (tags["workload"], tags["dtype"], tags["device"], tags["seed"], tags["sweep.seed"]) == \
        ("builtin", "float32", "cpu", "0", "3")
    assert tags["opt.paged_kv"] == "off" and tags["opt.dynamic_batching"] == "off"
    assert r.data.params["opts_effective.paged_kv.blocks_allocated"] == str(
        result.opts_effective["paged_kv"]["blocks_allocated"])
    found = client.search_runs([r.info.experiment_id], filter_string="tags.`opt.paged_kv` = 'off'")
    assert [x.info.run_id for x in found] == [result.run_id]
    assert tags["quality"] == "jsonl" and tags["quality.file"] == "chat_prompts.jsonl" and "workload.file" not in tags


def test_the_workload_and_prompt_set_are_dataset_inputs_named_by_file(run):
    result, _, r, _ = run
    inputs = {d.dataset.name: d for d in r.inputs.dataset_inputs}
    assert set(inputs) == {"builtin", "chat_prompts"}
    prompts = inputs["chat_prompts"]
    assert json.loads(prompts.dataset.source) == {"uri": str(CHAT.resolve())}
    assert prompts.dataset.digest == result.prompts_digest[:36]
    assert inputs["builtin"].dataset.digest == result.requests_digest[:36]
    assert {t.key: t.value for t in prompts.tags}["mlflow.data.context"] == "quality"
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["quality"]["set"] == "chat_prompts.jsonl" and summary["quality"]["path"] == str(CHAT)
    assert r.data.metrics["quality/skipped_rows"] == 0


def test_kv_curves_cover_the_replay_only_on_a_real_clock(run):
    result, client, r, _ = run
    hist = client.get_metric_history(result.run_id, "kv/used_gb")
    steps = [m.step for m in hist]
    assert len(hist) > 1 and steps == sorted(steps)
    # steps are ms since the replay started: none after it ended (quality, levels and profiling come later)
    assert steps[-1] <= result.metrics["perf/makespan_s"] * 1000 + 500
    assert r.info.start_time <= hist[0].timestamp <= hist[-1].timestamp <= r.info.end_time
    assert hist[-1].timestamp - hist[0].timestamp == pytest.approx(steps[-1] - steps[0], abs=5)


def test_results_md_and_artifacts_beside_the_database(run):
    result, client, r, tmp = run
    assert r.info.artifact_uri.startswith((tmp / "mlartifacts").as_uri())
    names = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"results.md", "load_levels.json", "profile_trace.json", "profile_ops.md", "summary.json"} <= names
    md = (result.run_dir / "results.md").read_text()
    ttft = fmt(result.metrics["perf/ttft_ms_p50"])
    assert "| TTFT p50 / p99 (ms) | " + ttft in md and "## Load levels (workload.rate)" in md


def test_a_chat_prompt_set_is_scored_turns_and_all(run):
    result, _, r, _ = run
    rows = [json.loads(x) for x in (result.run_dir / "quality_outputs.jsonl").read_text().splitlines()]
    assert [x["id"] for x in rows] == ["chat-01", "chat-02", "chat-03", "chat-04", "chat-05"]
    assert [len(x["messages"]) for x in rows] == [1, 2, 3, 3, 1]  # the conversation before the scored answer
    assert rows[2]["references"] == ["You have 5 apples now."]
    assert r.data.metrics["quality/num_prompts"] == 5 and "quality/bleu_vs_ref" in r.data.metrics
    # auto: each prompt's longest reference is 7, 8, 7, 6, 7 tokens; their p90, 7.6, rounded up (cap 12)
    assert r.data.metrics["quality/max_new_tokens"] == 8


def test_load_levels_are_mlflow_steps(run):
    result, client, _, _ = run
    assert [(m.step, m.value) for m in client.get_metric_history(result.run_id, "load/level")] == [(0, 5.0), (1, 40.0)]
    assert [m.step for m in client.get_metric_history(result.run_id, "load/e2e_ms_p99")] == [0, 1]
    assert [lv["metrics"]["load/requests_ok"] for lv in result.load_levels] == [6, 6]
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert [lv["value"] for lv in summary["load_levels"]] == [5.0, 40.0]


def test_profile_is_a_chrome_trace_with_stage_ranges(run):
    result, _, _, _ = run
    events = json.loads((result.run_dir / "profile_trace.json").read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"engine_step", "stage/decode", "stage/schedule"} <= names
    ops = (result.run_dir / "profile_ops.md").read_text()
    assert "## decode:" in ops and re.search(r"\| `aten::\w+` \| \d+ \|", ops)


def _documented_patterns() -> list[re.Pattern]:
    """The metric names docs/design.md's Metrics section lists, braces expanded, placeholders as wildcards."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## Metrics"):]
    section = section[:section.index("\n## ", 4)]
    pats = []
    for name in re.findall(r"`([a-z_]+/[^`\s]+)`", section):
        parts = re.split(r"(\{[^}]*\})", name)
        options = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
        for combo in itertools.product(*options):
            rx = re.escape("".join(combo)).replace(r"<stage>", "[a-z_]+").replace(r"\*", ".+")
            pats.append(re.compile(rx + "$"))
    return pats


def test_the_design_lists_every_metric_a_run_logs(run):
    _, _, r, _ = run
    pats = _documented_patterns()
    missing = sorted(k for k in r.data.metrics if not k.startswith("system/") and not any(p.match(k) for p in pats))
    assert not missing, f"logged but not in docs/design.md's Metrics section: {missing}"


def test_broken_prompt_set_stops_the_run_before_any_engine(tmp_path):
    bad = tmp_path / "mine.jsonl"
    bad.write_text('{"id": "a", "prompt": "p", "references": ["r"]}\n{"id": "b", "prompt": }\n')
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_config([f"tracking.uri={uri}", "quality=jsonl", f"quality.path={bad}"])
    with pytest.raises(UserError, match=f"{re.escape(str(bad))}:2: not valid JSON"):
        run_experiment(cfg, tmp_path / "out")
    assert not (tmp_path / "out" / "requests.jsonl").exists()
    assert not Path(tmp_path / "mlflow.db").exists()  # no MLflow run for a run that never started
