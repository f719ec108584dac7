"""What a passing verdict leads to, exactly: the staged plan, the registry's files, and the rollback command's
words (optladder/abtest/rollout.py, optladder/abtest/rollback.py)."""
from __future__ import annotations

import json
import re
import time

import pytest

from optladder.abtest.rollback import describe, main
from optladder.abtest.rollout import DEFAULT_REGISTRY, current, promote, rollback, rollout_plan
from optladder.abtest.verdict import GateResult, Verdict

PASSED = Verdict("pass", [GateResult("exact_match", "quality/exact_match_vs_control", "pass", "ok", None, 1.0),
                          GateResult("latency_max_regression", "perf/e2e_ms_p99", "pass", "ok", 1.0, 1.0)], 0,
                 "control", "candidate")


def test_the_plan_is_every_stage_with_its_weights_and_gates():
    plan = rollout_plan(PASSED, "flash_attn", stages=(2.5, 50, 100.0))
    assert plan == {"candidate": "flash_attn", "control": "control", "verdict": "pass", "stages": [
        {"stage": 1, "candidate_weight_pct": 2.5, "control_weight_pct": 97.5, "on_fail": "rollback",
         "recheck_gates": ["exact_match:quality/exact_match_vs_control", "latency_max_regression:perf/e2e_ms_p99"]},
        {"stage": 2, "candidate_weight_pct": 50, "control_weight_pct": 50, "on_fail": "rollback",
         "recheck_gates": ["exact_match:quality/exact_match_vs_control", "latency_max_regression:perf/e2e_ms_p99"]},
        {"stage": 3, "candidate_weight_pct": 100, "control_weight_pct": 0, "on_fail": "rollback",
         "recheck_gates": ["exact_match:quality/exact_match_vs_control", "latency_max_regression:perf/e2e_ms_p99"]}]}
    assert [type(s["candidate_weight_pct"]) for s in plan["stages"]] == [float, int, int]
    assert rollout_plan(PASSED, "x", gate_names=["exact_match:quality/exact_match_vs_control"])["stages"][0][
        "recheck_gates"] == ["exact_match:quality/exact_match_vs_control"]


@pytest.mark.parametrize("stages", [(), (0, 100), (50, 101), (50, 50, 100), (60, 40, 100), (-5, 100)])
def test_stages_must_rise_strictly_within_0_to_100(stages):
    with pytest.raises(ValueError, match=re.escape(f"rollout stages must be strictly increasing percentages in "
                                                   f"(0, 100], got {list(stages)}")):
        rollout_plan(PASSED, "x", stages=stages)


def test_stages_must_end_at_full_rollout():
    with pytest.raises(ValueError, match=re.escape("rollout stages must end at 100 (full rollout), got [1, 50]")):
        rollout_plan(PASSED, "x", stages=(1, 50))
    with pytest.raises(ValueError, match=re.escape("no rollout plan for a verdict of 'inconclusive'; only 'pass'")):
        rollout_plan(Verdict("inconclusive", [], 2), "x")


def test_promote_writes_the_entry_and_the_audit_trail(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: f"<{fmt}>")
    reg = tmp_path / "deep" / "registry"  # parents are created
    path = promote(reg, {"overrides": ["+opt=paged_kv"], "b": 1, "a": 2}, "run-1", "paged_kv")
    entry = {"name": "paged_kv", "promoted_at": "<%Y-%m-%dT%H:%M:%S%z>", "run_id": "run-1",
             "snapshot": {"a": 2, "b": 1, "overrides": ["+opt=paged_kv"]}}
    assert path == reg / "current.json" and path.read_text() == json.dumps(entry, indent=2, sort_keys=True) + "\n"
    assert (reg / "history.jsonl").read_text() == json.dumps({"entry": entry, "event": "promote"},
                                                             sort_keys=True) + "\n"
    assert sorted(p.name for p in reg.iterdir()) == ["current.json", "history.jsonl"]  # no temporary left
    promote(reg, {"overrides": ["+opt=[paged_kv,flash_attn]"]}, "run-2", "flash_attn")
    assert rollback(reg) == entry and current(reg) == entry
    last = json.loads((reg / "history.jsonl").read_text().splitlines()[-1])
    assert last == {"event": "rollback", "undone_run_id": "run-2", "at": "<%Y-%m-%dT%H:%M:%S%z>"}


@pytest.mark.parametrize("args, message", [(({}, "", "x"), "promote needs a run_id and a name, got run_id='', "
                                            "name='x'"),
                                           (({}, "r", ""), "got run_id='r', name=''"),
                                           (([], "r", "x"), "promote needs the config snapshot as a dict, got list")])
def test_promote_refuses_what_it_cannot_record(tmp_path, args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        promote(tmp_path, *args)
    assert not (tmp_path / "history.jsonl").exists()
    with pytest.raises(TypeError):  # not JSON: refused before any file is touched
        promote(tmp_path, {"x": object()}, "r", "x")
    assert not (tmp_path / "history.jsonl").exists()


def test_describe_and_the_rollback_command(tmp_path, capsys):
    entry = {"name": "flash_attn", "run_id": "run-2", "promoted_at": "2026-01-02T03:04:05",
             "snapshot": {"overrides": ["+opt=flash_attn", "seed=1"]}}
    assert describe(entry) == ("flash_attn (run run-2, promoted 2026-01-02T03:04:05)\n"
                               "  overrides: ['+opt=flash_attn', 'seed=1']\n"
                               "  reproduce: python run.py '+opt=flash_attn' 'seed=1'")
    assert describe({"name": "base", "run_id": "r"}) == ("base (run r, promoted None)\n  overrides: []\n"
                                                         "  reproduce: python run.py")
    assert main(["--registry", str(tmp_path), "--show"]) == 0
    assert capsys.readouterr().out == f"no promoted baseline in {tmp_path}\n"
    promote(tmp_path, {"overrides": ["+opt=paged_kv"]}, "run-1", "paged_kv")
    assert main(["--registry", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: nothing to roll back to in {tmp_path}: 1 promotion(s) in force, a rollback needs a "
                   "previous one\n")
    promote(tmp_path, {"overrides": ["+opt=flash_attn"]}, "run-2", "flash_attn")
    assert main(["--registry", str(tmp_path), "--show"]) == 0
    assert capsys.readouterr().out == describe(current(tmp_path)) + "\n"
    assert main(["--registry", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "rolled back to:\n" + describe(current(tmp_path)) + "\n"
    assert current(tmp_path)["run_id"] == "run-1"


def test_the_command_defaults_to_the_project_registry_and_explains_itself(tmp_path, monkeypatch, capsys):
    import optladder.abtest.rollback as rollback

    monkeypatch.setattr(rollback, "DEFAULT_REGISTRY", tmp_path / "rollouts")
    assert main(["--show"]) == 0 and capsys.readouterr().out == f"no promoted baseline in {tmp_path / 'rollouts'}\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Return to the previously promoted baseline." in text
    assert "--show print the current baseline, change nothing" in text
    assert DEFAULT_REGISTRY.name == "rollouts" and DEFAULT_REGISTRY.parent.joinpath("run.py").exists()
