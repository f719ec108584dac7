"""run.py as a user meets it when something is wrong: one line and exit 3 for a bad config or bad data,
before anything runs; a sweep that runs what the machine supports and names what it skipped."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from optladder.experiments.errors import USER_ERROR_EXIT

pytestmark = pytest.mark.e2e  # processes of their own: the command, a server, a shell script

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny", "replay.progress=false", "engine.kv_cache_gb=0.05", "engine.max_model_len=1024",
        "tracking.system_metrics=false", "quality.max_new_tokens=8", "workload.rate=20", "workload.num_requests=4",
        "quality.num_prompts=3"]


def run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPTLADDER_CACHE": os.environ.get("OPTLADDER_CACHE", str(ROOT / ".cache"))}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


def lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip()]


def test_a_user_error_is_one_line_and_exit_3_and_verbose_shows_the_traceback(tmp_path):
    args = [*FAST, "tracking.enabled=false", f"hydra.run.dir={tmp_path / 'out'}", "quality.path=/data/mine.jsonl"]
    p = run(args)
    assert p.returncode == USER_ERROR_EXIT
    assert lines(p.stderr) == ["optladder: error: quality.path='/data/mine.jsonl' is read only by quality=jsonl, but "
                               "the set is quality=builtin: use quality=jsonl quality.path=/data/mine.jsonl"]
    v = run([*args, "--verbose"])
    assert v.returncode not in (0, USER_ERROR_EXIT) and "Traceback" in v.stderr and "quality.path" in v.stderr
    bad = run([*FAST, "tracking.enabled=false", "workload.num_requests=many"])  # does not even compose
    assert bad.returncode == USER_ERROR_EXIT and len(lines(bad.stderr)) == 1 and "'many'" in bad.stderr


def test_an_ab_candidates_broken_prompt_set_stops_it_before_the_control_runs(tmp_path):
    broken = tmp_path / "mine.jsonl"
    broken.write_text('{"id": "a", "prompt": "p", "references": ["r"]}\n{"id": "b", "prompt": "q", references: []}\n')
    out = tmp_path / "ab"
    p = run(["+ab=batched_decode", f"ab.candidate=[+opt=batched_decode,quality=jsonl,quality.path={broken}]",
             "tracking.enabled=false", f"hydra.run.dir={out}", *FAST])
    assert p.returncode == USER_ERROR_EXIT, p.stderr[-2000:]
    assert len(lines(p.stderr)) == 1 and lines(p.stderr)[0].startswith(f"optladder: error: {broken}:2: not valid JSON")
    assert not list(out.glob("*/requests.jsonl"))  # nothing was replayed


def test_sweep_adds_prerequisites_and_skips_what_this_machine_cannot_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    alpaca = ROOT / "docs" / "examples" / "alpaca_prompts.json"  # and a user's Alpaca file, scored end to end
    p = run(["-m", "+opt=cuda_graphs,prefix_cache", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
             *FAST, "quality=jsonl", f"quality.path={alpaca}"])
    assert p.returncode == 0, p.stderr[-3000:]
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("optladder").experiment_id])
    parent = next(r for r in runs if r.data.tags.get("optladder.kind") == "sweep")
    kids = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert parent.info.run_name == "sweep: +opt=cuda_graphs,prefix_cache" and parent.info.status == "FINISHED"
    skipped = kids["reference:cuda_graphs:tiny quality=alpaca_prompts (skipped)"]  # the user set names the run
    assert skipped.info.status == "KILLED" and "CUDA only" in skipped.data.tags["optladder.skipped"]
    ran = kids["reference:paged_kv+prefix_cache:tiny quality=alpaca_prompts"]
    assert ran.info.status == "FINISHED" and ran.data.tags["optladder.added_needs"] == "paged_kv"
    assert ran.data.tags["opt.paged_kv"] == "on" and ran.data.tags["opt.prefix_cache"] == "on"
    table = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "skipped: cuda_graphs runs on CUDA only" in table and "| ran |" in table
    assert "sweep.md" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert json.loads((tmp_path / "sweep" / "0" / "skipped.json").read_text())["skipped"].startswith("cuda_graphs")
    rows = [json.loads(x) for x in (tmp_path / "sweep" / "1" / "quality_outputs.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["alpaca_prompts-00001", "alpaca_prompts-00002", "alpaca_prompts-00003"]
    assert rows[0]["prompt"] == "Give the plural of the word.\n\nmouse" and ran.data.metrics["quality/num_prompts"] == 3


def test_a_bad_ladder_or_gate_setting_is_one_line_before_anything_runs(tmp_path):
    for i, (args, said) in enumerate(((["+ladder=seed", "ladder.rerun_control=sometimes"],
                        "optladder: error: ladder.rerun_control='sometimes' is not one of differs, always, never"),
                       (["+ab=aa", "gate.environment_check=same"],
                        "optladder: error: gate.environment_check='same' is not one of latency, report, ignore"))):
        out = tmp_path / f"case{i}"
        p = run([*FAST, "tracking.enabled=false", f"hydra.run.dir={out}", *args])
        assert p.returncode == USER_ERROR_EXIT, p.stderr[-2000:]
        assert len(lines(p.stderr)) == 1 and lines(p.stderr)[0].startswith(said)
        assert not any(out.glob("*-r0"))  # no arm, no rung ran
