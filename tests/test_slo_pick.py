"""The best config of a knob sweep under an SLO, on synthetic load levels, and the A/B command that gates it."""
from __future__ import annotations

import json
import shlex

import pytest
import yaml

from optladder.experiments.load_curves import write_load_curves
from optladder.experiments.resume import _measured
from optladder.experiments.slo_pick import best_under_slo, gate
from optladder.traffic.metrics import SLO

SLO_1S = SLO(ttft_p99_s=1.0, tpot_p99_s=0.1)


def lv(value: float, tok_s: float, ttft_ms: float, tpot_ms: float = 20.0, failed: int = 0,
       knob: str = "workload.rate") -> dict:
    return {"index": 0, "knob": knob, "value": float(value),
            "metrics": {"load/out_tok_s_per_gpu": tok_s, "load/out_tok_s_per_user": tok_s / value,
                        "load/throughput_out_tok_s": tok_s, "load/e2e_ms_p99": ttft_ms * 2,
                        "load/ttft_ms_p99": ttft_ms, "load/tpot_ms_p99": tpot_ms,
                        "load/requests_ok": 100.0 - failed, "load/requests_failed": float(failed)}}


def test_the_best_is_the_most_throughput_at_the_highest_load_still_within_the_slo():
    curves = {"small": [lv(1, 50, 100), lv(4, 100, 400), lv(8, 120, 1500)],  # sustains 4: 100 tok/s
              "big": [lv(1, 50, 120), lv(4, 110, 500), lv(8, 150, 900)],  # sustains 8: 150 tok/s
              "fast_tpot_miss": [lv(1, 60, 50), lv(4, 200, 300, tpot_ms=150)]}  # TPOT misses at 4: 60 at 1
    pick = best_under_slo(curves, SLO_1S)
    assert (pick["best"]["config"], pick["best"]["level"]) == ("big", 8.0)
    assert (pick["runner_up"]["config"], pick["runner_up"]["level"]) == ("small", 4.0)
    assert pick["margin_tok_s"] == pytest.approx(50) and pick["margin_pct"] == pytest.approx(50)
    assert not pick["tied"] and pick["closest"] is None
    miss = {c["config"]: c["first_miss"] for c in pick["configs"]}
    assert miss["big"] is None and miss["small"]["level"] == 8.0
    assert miss["fast_tpot_miss"]["misses"] == ["TPOT p99 150 ms > 100 ms"]
    assert "best under the SLO (TTFT p99 <= 1000 ms, TPOT p99 <= 100 ms, failed <= 1%): big" in pick["summary"]
    assert "runner-up small, 100 at workload.rate=4 (+50 tok/s, +50.0%)" in pick["summary"]


def test_a_miss_at_lower_load_is_not_redeemed_by_a_pass_above_it():
    pick = best_under_slo({"noisy": [lv(1, 50, 100), lv(2, 80, 1200), lv(4, 300, 900)],
                           "steady": [lv(1, 50, 100), lv(2, 90, 500), lv(4, 95, 2000)]}, SLO_1S)
    assert (pick["best"]["config"], pick["best"]["level"]) == ("steady", 2.0)
    assert pick["configs"][0]["slo_point"]["level"] == 1.0


def test_trace_time_scales_are_less_load_the_larger_they_are():
    ts = "workload.time_scale"
    pick = best_under_slo({"a": [lv(4, 30, 100, knob=ts), lv(1, 120, 800, knob=ts), lv(0.5, 200, 3000, knob=ts)]},
                          SLO_1S)
    assert pick["best"]["level"] == 1.0 and pick["configs"][0]["first_miss"]["level"] == 0.5


def test_failed_requests_count_as_infinitely_slow_and_a_null_bound_is_left_out():
    curves = {"drops": [lv(1, 500, 10, failed=2)], "slow_tokens": [lv(1, 100, 10, tpot_ms=900)]}
    assert best_under_slo(curves, SLO_1S)["best"] is None
    pick = best_under_slo(curves, SLO(ttft_p99_s=1.0, tpot_p99_s=None))
    assert pick["best"]["config"] == "slow_tokens" and pick["runner_up"] is None
    assert pick["summary"].endswith("the only config that meets it")
    assert best_under_slo({"one": [lv(1, 100, 10, failed=1)]}, SLO_1S)["best"] is not None  # 1% is within


def test_none_meeting_names_the_closest():
    pick = best_under_slo({"a": [lv(1, 50, 3000), lv(2, 90, 6000)], "b": [lv(1, 40, 1500), lv(2, 70, 4000)],
                           "c": [lv(1, 90, 100, failed=50)]}, SLO_1S)
    assert pick["best"] is None and pick["runner_up"] is None
    assert (pick["closest"]["config"], pick["closest"]["level"]) == ("b", 1.0)
    assert pick["summary"] == ("no config meets the SLO (TTFT p99 <= 1000 ms, TPOT p99 <= 100 ms, failed <= 1%) at any "
                               "load level; the closest: b at workload.rate=1 (TTFT p99 1500 ms > 1000 ms)")


def test_ties_go_to_the_lower_ttft_then_the_earlier_job():
    pick = best_under_slo({"first": [lv(2, 100, 600)], "second": [lv(2, 100, 300)]}, SLO_1S)
    assert pick["best"]["config"] == "second" and pick["tied"] and pick["margin_tok_s"] == 0
    assert "tied with first" in pick["summary"]
    same = best_under_slo({"first": [lv(2, 100, 300)], "second": [lv(2, 100, 300)]}, SLO_1S)
    assert same["best"]["config"] == "first" and same["tied"]


def test_slo_level_bounds_are_validated_and_ignored_by_a_resume():
    assert (SLO().ttft_p99_s, SLO().tpot_p99_s) == (1.0, 0.1)
    with pytest.raises(ValueError, match="slo.tpot_p99_s must be > 0, got 0"):
        SLO(tpot_p99_s=0)
    old = {"e2e_s": 3.0, "ttft_s": None, "tpot_s": None}
    assert _measured("slo", {**old, "ttft_p99_s": 2.0, "tpot_p99_s": None}) == _measured("slo", old)
    assert _measured("slo", {**old, "e2e_s": 1.0}) != _measured("slo", old)


def test_the_gate_is_an_ab_config_and_the_command_that_runs_it(tmp_path):
    best = best_under_slo({"x": [lv(8, 100, 300)]}, SLO_1S)["best"]
    base = ["engine=vllm", "model=smollm2_135m", "replay.load_levels=[1,2,4,8]", "workload.rate=2"]
    g = gate(best, ["engine.max_num_seqs=64", "engine.max_num_batched_tokens=2048"], base,
             {"engine.max_num_seqs": "16", "engine.max_num_batched_tokens": "8192"}, tmp_path, False)
    args = shlex.split(g["command"])
    assert args[:4] == ["python", "run.py", "engine=vllm", "model=smollm2_135m"]
    assert "workload.rate=8" in args and "workload.rate=2" not in args  # at the load the best sustains
    assert not any(a.startswith("replay.load_levels") for a in args) and args[-1] == "+ab=knob_sweep_best"
    assert f"hydra.searchpath=[file://{tmp_path.resolve() / 'gate'}]" in args
    ab = yaml.safe_load((tmp_path / "gate" / "ab" / "knob_sweep_best.yaml").read_text())
    assert ab == {"name": "knob_sweep_best", "control": [], "repeats": 1,
                  "candidate": ["engine.max_num_seqs=64", "engine.max_num_batched_tokens=2048"]}
    assert gate(best, ["engine.max_num_seqs=16"], base, {"engine.max_num_seqs": "16"}, tmp_path / "d", True
                )["command"] is None
    assert gate(None, [], base, {}, tmp_path / "n", False)["why"] == "no config meets the SLO: nothing to gate"


def test_pareto_files_name_the_best(tmp_path):
    curves = {"a": [lv(1, 50, 100), lv(4, 100, 400)], "b": [lv(1, 60, 100), lv(4, 300, 3000)]}
    pick = best_under_slo(curves, SLO_1S)
    written = write_load_curves(curves, tmp_path, pick, {"command": None, "why": "nothing to gate"})
    assert len(written) == 3
    doc = json.loads((tmp_path / "pareto.json").read_text())
    assert doc["best"]["config"] == "a" and doc["runner_up"]["config"] == "b"
    assert doc["slo"] == {"ttft_p99_ms": 1000.0, "tpot_p99_ms": 100.0, "failed_share_max": 0.01}
    md = (tmp_path / "pareto.md").read_text()
    assert "## Best config under the SLO" in md and "| b | workload.rate=1 | 60 | 100 | 20 | workload.rate=4: " \
           "TTFT p99 3000 ms > 1000 ms |" in md and "nothing to gate" in md
    none = best_under_slo({"a": [lv(1, 50, 5000, failed=90)]}, SLO_1S)
    (tmp_path / "none").mkdir()
    write_load_curves({"a": [lv(1, 50, 5000, failed=90)]}, tmp_path / "none", none)
    assert json.loads((tmp_path / "none" / "pareto.json").read_text())["closest"]["worst_ratio"] is None  # inf
