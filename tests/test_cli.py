"""run.py as a user runs it: a real Hydra multirun and real A/Bs, as subprocesses."""
import pytest
import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.e2e  # processes of their own: the command, a server, a shell script

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny", "replay.progress=false", "engine.kv_cache_gb=0.05", "engine.max_model_len=1024",
        "tracking.system_metrics=false", "quality.max_new_tokens=8", "workload.rate=20"]


def run(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPTLADDER_CACHE": str(ROOT / ".cache")}
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


def test_multirun_makes_one_parent_and_a_child_per_job(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    p = run(["-m", "seed=1,2", "workload.num_requests=8", "quality.num_prompts=4", f"tracking.uri={uri}",
             f"hydra.sweep.dir={tmp_path / 'sweep'}", "replay.load_levels=[10,40]", *FAST], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    exp = client.get_experiment_by_name("optladder")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert {c.data.params["seed"] for c in children} == {"1", "2"}
    assert parents[0].info.status == "FINISHED"
    for job in ("0", "1"):
        assert (tmp_path / "sweep" / job / "summary.json").exists()
    # named by what differs, the parent by its sweep; the load curves of both jobs on the parent
    assert sorted(c.info.run_name for c in children) == ["reference:baseline:tiny seed=1",
                                                          "reference:baseline:tiny seed=2"]
    assert {c.data.tags["sweep.seed"] for c in children} == {"1", "2"}
    assert parents[0].info.run_name == "sweep: seed=1,2"
    assert {"sweep.md", "pareto.md", "pareto.json", "load_curves.png"} <= {
        a.path for a in client.list_artifacts(parents[0].info.run_id)}


def test_ab_lossless_candidate_matches_control_and_writes_a_verdict(tmp_path):
    out = tmp_path / "ab"
    p = run(["+ab=batched_decode", "workload.num_requests=12", "quality.num_prompts=12", "tracking.enabled=false",
             f"hydra.run.dir={out}", "ab.registry_dir=" + str(tmp_path / "reg"), *FAST], tmp_path)
    v = json.loads((out / "verdict.json").read_text())
    statuses = {g["status"] for g in v["gates"]}
    worst = "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    assert v["status"] == worst and p.returncode == v["exit_code"] == {"pass": 0, "fail": 1, "inconclusive": 2}[worst]
    assert v["candidate_lossless"] is True
    # identical greedy text: every quality gate passes; only latency may be undecided on 12 tiny requests
    assert all(g["status"] == "pass" for g in v["gates"] if g["metric"].startswith("quality/")), v["gates"]
    em = [g for g in v["gates"] if g["metric"] == "quality/exact_match_vs_control"]
    assert em and em[0]["status"] == "pass" and em[0]["candidate"] == 1.0
    assert (out / "review.html").exists()
    assert (out / "rollout_plan.json").exists() == (v["status"] == "pass")


def test_ab_lossless_candidate_checked_teacher_forced_runs_both_engines_again(tmp_path):
    # what a GPU run does in bfloat16 (gate.lossless_check=auto), forced here in float32: flash_attn is on the
    # teacher-forced pass's path, so its scores decide and the exact match is reported; random weights: the KL
    out = tmp_path / "ab"
    p = run(["+ab=flash_attn", "gate.lossless_check=teacher_forced", "workload.num_requests=6",
             "quality.num_prompts=12", "tracking.enabled=false", f"hydra.run.dir={out}", *FAST], tmp_path)
    v = json.loads((out / "verdict.json").read_text())
    assert v["candidate_lossless"] is True and "checked teacher-forced" in v["lossless_reason"], p.stderr[-2000:]
    assert v["opts_in_effect_differ"] == []  # flash_attn differs in effect, but it is what the A/B asks about
    g = {g["metric"]: g for g in v["gates"]}
    assert not g["quality/exact_match_vs_control"]["decides"]
    assert g["quality/kl_vs_control_mean"]["decides"] and g["quality/kl_vs_control_mean"]["status"] == "pass"
    assert g["quality/kl_vs_control_mean"]["interval"]["high"] < 1e-3
    assert not g["quality/top1_agree_vs_control"]["decides"]  # model=tiny: random weights
    summary = json.loads((out / "candidate-r0" / "teacher_forced.json").read_text())
    assert summary["unavailable"] is None and summary["metrics"]["quality/tf_positions"] > 0


def test_ab_with_different_traffic_is_refused(tmp_path):
    p = run(["+ab=batched_decode", "ab.candidate=[+opt=batched_decode,workload.seed=9]", "workload.num_requests=4",
             "quality.num_prompts=2", "tracking.enabled=false", f"hydra.run.dir={tmp_path / 'ab'}", *FAST], tmp_path)
    assert p.returncode != 0
    assert "identical traffic" in p.stderr and "requests_digest" in p.stderr


def test_ab_with_a_damaged_candidate_fails_on_the_teacher_forced_gates_with_exit_1(tmp_path):
    out = tmp_path / "ab"
    p = run(["+ab=damaged_3bit", "ab.candidate=[model.damage=zero_layer:0]", "workload.num_requests=6",
             "quality.num_prompts=12", "quality.max_new_tokens=16", "tracking.enabled=false",
             f"hydra.run.dir={out}", *FAST], tmp_path)
    v = json.loads((out / "verdict.json").read_text())
    assert v["candidate_lossless"] is False and "model.damage" in v["lossless_reason"]
    assert (p.returncode, v["status"]) == (1, "fail"), p.stdout[-2000:]
    tf = {g["metric"]: g for g in v["gates"] if g["gate"] == "teacher_forced"}
    assert tf["quality/kl_vs_control_mean"]["status"] == "fail" and tf["quality/kl_vs_control_mean"]["decides"]
    assert tf["quality/kl_vs_control_mean"]["interval"]["low"] > 0.01
    drift = [g for g in v["gates"] if g["gate"] == "control_agreement"]
    assert drift and not any(g["decides"] for g in drift)  # reported: a lossy change rewrites answers anyway
    summary = json.loads((out / "candidate-r0" / "teacher_forced.json").read_text())
    assert summary["metrics"]["quality/kl_vs_control_mean"] > 0.01 and summary["unavailable"] is None
    assert len((out / "candidate-r0" / "teacher_forced.jsonl").read_text().splitlines()) == 12
    assert not (out / "rollout_plan.json").exists()


def test_knob_sweep_names_its_best_config_under_the_slo_and_the_ab_that_gates_it(tmp_path):
    from optladder.experiments.build import build
    from optladder.experiments.levels import read_levels
    from optladder.experiments.slo_pick import best_under_slo
    from optladder.traffic.metrics import SLO
    from tests.conftest import compose_config

    sweep = tmp_path / "sweep"
    p = run(["-m", "engine.max_num_seqs=1,4", "+opt=[paged_kv,dynamic_batching]", "replay.load_levels=[10,40]",
             "workload.num_requests=6", "quality.num_prompts=2", "tracking.enabled=false", "slo.ttft_p99_s=60",
             "slo.tpot_p99_s=60", f"hydra.sweep.dir={sweep}", *FAST], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((sweep / "pareto.json").read_text())
    labels = {f"reference:paged_kv+dynamic_batching:tiny engine.max_num_seqs={n}": sweep / str(j)
              for j, n in enumerate((1, 4))}
    # consistent with its own points: the same pick from the jobs' levels, and on the chart's points
    again = best_under_slo({k: read_levels(d) for k, d in labels.items()}, SLO(ttft_p99_s=60, tpot_p99_s=60))
    best = doc["best"]
    assert best is not None and best["config"] in labels and best == again["best"]
    assert best["per_gpu"] == max(pt["per_gpu"] for pt in doc["points"])  # both meet this SLO at every level
    assert {(pt["config"], pt["level"]) for pt in doc["points"]} >= {(best["config"], best["level"])}
    assert doc["runner_up"]["config"] != best["config"] and doc["margin_tok_s"] >= 0
    assert doc["best_summary"] in p.stdout and "## Best config under the SLO" in (sweep / "pareto.md").read_text()
    # the gate: printed, not run; neither job is the defaults (max_num_seqs 16), so it A/Bs the best against them
    g = doc["gate"]
    assert g["defaults"] == {"engine.max_num_seqs": "16"} and g["command"] in p.stdout
    assert g["candidate"] == [f"engine.max_num_seqs={best['config'].rsplit('=', 1)[1]}"]
    assert not (sweep / "gate" / "ab" / "verdict.json").exists()
    ab = build(compose_config([f"hydra.searchpath=[file://{sweep / 'gate'}]", "+ab=knob_sweep_best"])).ab
    assert (ab.control, ab.candidate) == ([], g["candidate"])
