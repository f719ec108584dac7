"""Verdict details at their boundaries: the interval a gate reports is the one it claims, the non-inferiority
margin on point values points the right way, exact agreement of exactly the required share passes."""
from __future__ import annotations

import re

import numpy as np
import pytest

from optladder.abtest.gates import GateConfig
from optladder.abtest.stats import Interval, bootstrap_mean_delta
from optladder.abtest.verdict import ArmResult, decide, verdict_table
from tests.test_gates import arm, by_name
from optladder.traffic.metrics import compute_metrics
from optladder.traffic.request import RequestRecord

NO_TF = dict(kl_max_mean=None, kl_max_p99=None, top1_agree_min=None, ppl_max_rel_increase=None)  # lossy arms here
NOISE = {"perf/e2e_ms_p99": 0.02, "perf/ttft_ms_p50": 0.02}  # an A/A-measured run-to-run SD: one run pair decides
RUN = ("over 1 run pair(s) (0 requests dropped; run noise SD 2.0% from 0 df of the pairs and gate.run_noise 2.0% x 4)"
       "; this run resolves changes of ±7.7% (80% power)")


@pytest.mark.parametrize("alpha, z", [(0.05, 1.960), (0.10, 1.645)])
def test_the_interval_has_the_coverage_it_is_reported_with(alpha, z):
    """Paired differences of known spread: a (1 - alpha) interval of their mean spans about +-z standard
    errors. A 90% interval labelled 95% (or the reverse) is 16% narrower or 19% wider."""
    rng = np.random.default_rng(3)
    control = rng.normal(10.0, 1.0, 2000)
    candidate = control + rng.normal(0.0, 1.0, 2000)
    diff = candidate - control
    iv = bootstrap_mean_delta(control, candidate, n_boot=4000, seed=0, alpha=alpha, relative=False)
    half_width = (iv.high - iv.low) / 2 / (diff.std(ddof=1) / np.sqrt(len(diff)))
    assert half_width == pytest.approx(z, rel=0.05)


def test_the_reason_names_the_confidence_the_gate_used():
    cfg = GateConfig(alpha=0.10, control_agreement_min={}, run_noise=NOISE)
    g = by_name(decide(arm("c"), arm("k"), cfg, False))
    assert "[90% CI" in g["quality_non_inferiority:quality/bleu_vs_ref"].reason
    assert "[90% CI" in g["latency_max_regression:perf/e2e_ms_p99"].reason


@pytest.mark.parametrize("change, status", [(-0.002, "pass"), (+0.002, "pass"), (-0.004, "fail")])
def test_non_inferiority_on_point_values_allows_a_drop_within_the_margin(change, status):
    """No per-prompt scores: the candidate may be up to the margin (0.3% for BLEU) below the control."""
    c, k = arm("c"), arm("k")
    c.quality_per_prompt, k.quality_per_prompt = {}, {}
    k.metrics["quality/bleu_vs_ref"] = c.metrics["quality/bleu_vs_ref"] * (1 + change)
    g = by_name(decide(c, k, GateConfig(), False))["quality_non_inferiority:quality/bleu_vs_ref"]
    assert g.status == status, g.reason


@pytest.mark.parametrize("share, status", [(0.99, "pass"), (0.98, "fail"), (1.0, "pass")])
def test_exact_match_of_exactly_the_required_share_passes(share, status):
    k = arm("k", extra={"quality/exact_match_vs_control": share})
    g = by_name(decide(arm("c"), k, GateConfig(min_exact_match_lossless=0.99), candidate_lossless=True))
    assert g["exact_match:quality/exact_match_vs_control"].status == status


# --- every gate's result, whole, on arms whose numbers can be checked by hand ---
# 20 requests with E2E evenly spread over 1-2 s and TTFT a quarter of it; 20 prompts scoring `score` each.
QUALITY = ("quality/bleu_vs_ref", "quality/rouge1_vs_ref", "quality/rouge2_vs_ref", "quality/rougeL_vs_ref")


def even_arm(name: str, scale: float = 1.0, score: float = 40.0, extra: dict | None = None, n: int = 20,
             per_prompt: bool = True, ttft_share: float = 0.25) -> ArmResult:
    e2e = np.linspace(1.0, 2.0, n) * scale
    records = [RequestRecord(f"r{i}", 0.0, 8, 5, sent_at=0.0, first_token_at=t * ttft_share, finished_at=t,
                             output_tokens=5, ok=True) for i, t in enumerate(e2e)]
    metrics = (compute_metrics(records) | {q: score for q in QUALITY}
               | {"quality/bleu_vs_control": 100.0, "quality/rougeL_vs_control": 1.0} | (extra or {}))
    return ArmResult(name, metrics, records, {q: [score] * n for q in QUALITY} if per_prompt else {}, [],
                     "req", "prm")


def results(verdict) -> list[tuple]:
    return [(g.gate, g.metric, g.status, g.reason, g.control, g.candidate) for g in verdict.gates]


EVERY_GATE = GateConfig(quality_margins_rel={"quality/bleu_vs_ref": 0.003},
                        control_agreement_min={"quality/bleu_vs_control": 99.7},
                        latency_gains={"perf/throughput_req_s": 0.1, "perf/ttft_ms_p50": 0.0},
                        latency_max_regression={"perf/e2e_ms_p99": 0.1}, memory_ceilings_gb={"perf/peak_mem_gb": 80},
                        n_boot=200, run_noise=NOISE)


def test_every_gate_reports_its_numbers_and_status():
    """Candidate twice as fast, 10% worse on BLEU, at the memory ceiling and the exact-match floor."""
    control = even_arm("control", extra={"perf/peak_mem_gb": 70.0})
    candidate = even_arm("candidate", 0.5, 36.0, extra={"perf/peak_mem_gb": 80.0,
                                                        "quality/exact_match_vs_control": 0.99})
    v = decide(control, candidate, EVERY_GATE, candidate_lossless=True)
    assert (v.status, v.exit_code, v.control, v.candidate) == ("fail", 1, "control", "candidate")
    assert results(v) == [
        ("quality_non_inferiority", "quality/bleu_vs_ref", "fail", "quality/bleu_vs_ref: control 40, candidate 36; "
         "per-prompt mean change -10.00% [95% CI -10.00%, -10.00%; n=20] paired by prompt; margin -0.30% -> fail",
         40.0, 36.0),
        ("exact_match", "quality/exact_match_vs_control", "pass",
         "lossless candidate: 99.00% of outputs equal the control's, required 99.00% -> pass", None, 0.99),
        ("control_agreement", "quality/bleu_vs_control", "pass", "quality/bleu_vs_control: candidate's outputs "
         "scored against the control's: 100, required at least 99.7 -> pass", None, 100.0),
        # 20 requests over a 2 s (1 s) makespan
        ("latency_gain", "perf/throughput_req_s", "pass", "perf/throughput_req_s: control 10, candidate 20; change "
         "+100.00% (point values); required at least 10.00% better -> pass", 10.0, 20.0),
        # TTFT median 1.5 s / 4
        ("latency_gain", "perf/ttft_ms_p50", "pass", "perf/ttft_ms_p50: control 375, candidate 187.5; change "
         f"-50.00% [95% CI -52.70%, -47.15%; n=20] {RUN}; allowed at most 0.00% worse -> pass", 375.0, 187.5),
        # p99 of 20 even steps from 1 to 2 s: 1 + 18.81/19 s
        ("latency_max_regression", "perf/e2e_ms_p99", "pass", "perf/e2e_ms_p99: control 1990, candidate 995; change "
         f"-50.00% [95% CI -52.70%, -47.15%; n=20] {RUN}; allowed at most 10.00% worse -> pass", 1990.0, 995.0),
        ("memory_ceiling", "perf/peak_mem_gb", "pass", "perf/peak_mem_gb: candidate 80 GB (control 70 GB), ceiling "
         "80 GB -> pass", 70.0, 80.0)]


def test_a_slower_bigger_candidate_fails_its_latency_and_memory_gates():
    cfg = GateConfig(**NO_TF, quality_margins_rel={}, control_agreement_min={}, latency_max_regression={"perf/e2e_ms_p99": 0.1},
                     latency_gains={"perf/throughput_req_s": 0.0}, memory_ceilings_gb={"perf/peak_mem_gb": 80}, n_boot=200,
                     run_noise=NOISE)
    v = decide(even_arm("c"), even_arm("k", 1.5, extra={"perf/peak_mem_gb": 80.5}), cfg, False)
    assert v.status == "fail" and [g.status for g in v.gates] == ["fail", "fail", "fail"]
    assert results(v)[0][3] == ("perf/throughput_req_s: control 10, candidate 6.667; change -33.33% (point values); "
                                "allowed at most 0.00% worse -> fail")
    assert results(v)[1][3].endswith(f"change +50.00% [95% CI +41.90%, +58.56%; n=20] {RUN}; "
                                     "allowed at most 10.00% worse -> fail")
    assert results(v)[2] == ("memory_ceiling", "perf/peak_mem_gb", "fail", "perf/peak_mem_gb: candidate 80.5 GB, "
                             "ceiling 80 GB -> fail", None, 80.5)


def test_too_few_pairs_and_unmeasured_metrics_are_inconclusive_with_the_reason():
    cfg = GateConfig(quality_margins_rel={"quality/bleu_vs_ref": 0.003}, control_agreement_min={},
                     latency_max_regression={"perf/e2e_ms_p99": 0.1}, memory_ceilings_gb={"perf/peak_mem_gb": 80},
                     run_noise=NOISE)
    v = decide(even_arm("c", n=5), even_arm("k", 1.2, n=5), cfg, candidate_lossless=True)
    assert (v.status, v.exit_code) == ("inconclusive", 2)
    assert results(v) == [
        ("quality_non_inferiority", "quality/bleu_vs_ref", "inconclusive",
         "quality/bleu_vs_ref: only 5 prompts scored, fewer than gate.min_pairs=10", 40.0, 40.0),
        ("exact_match", "quality/exact_match_vs_control", "inconclusive",
         "quality/exact_match_vs_control was not measured in the candidate arm", 1.0, None),
        ("latency_max_regression", "perf/e2e_ms_p99", "inconclusive", "perf/e2e_ms_p99: control 1990, candidate 2388; "
         "change +20.00%, but only 5 requests ok in every run (0 dropped), fewer than gate.min_pairs=10", 1990.0, 2388.0),
        ("memory_ceiling", "perf/peak_mem_gb", "inconclusive",
         "perf/peak_mem_gb was not measured in the control and candidate arms", None, None)]


def test_quality_on_point_values_and_on_a_control_that_scores_zero():
    c, k = even_arm("c", per_prompt=False), even_arm("k", score=39.0, per_prompt=False)
    cfg = GateConfig(**NO_TF, quality_margins_rel={"quality/bleu_vs_ref": 0.003}, control_agreement_min={},
                     latency_max_regression={})
    assert results(decide(c, k, cfg, False)) == [
        ("quality_non_inferiority", "quality/bleu_vs_ref", "fail", "quality/bleu_vs_ref: control 40, candidate 39, "
         "change -2.50% (point values, no per-prompt scores); margin -0.30% -> fail", 40.0, 39.0)]
    zero = decide(even_arm("c", score=0.0), even_arm("k", score=0.0), cfg, False)
    assert results(zero)[0][2:] == ("pass", "quality/bleu_vs_ref: control 0, candidate 0; per-prompt mean change +0 "
                                    "[+0, +0] paired by prompt; margin -0.30% -> pass", 0.0, 0.0)
    k.metrics.pop("quality/bleu_vs_ref")
    assert results(decide(c, k, cfg, False))[0][2:] == (
        "inconclusive", "quality/bleu_vs_ref was not measured in the candidate arm", 40.0, None)


def test_a_latency_change_against_a_zero_control_is_undefined_not_a_pass():
    cfg = GateConfig(**NO_TF, quality_margins_rel={}, control_agreement_min={}, latency_max_regression={"perf/ttft_ms_p50": 0.1},
                     run_noise=NOISE)
    v = decide(even_arm("c", ttft_share=0.0), even_arm("k"), cfg, False)
    assert results(v) == [("latency_max_regression", "perf/ttft_ms_p50", "inconclusive", "perf/ttft_ms_p50: control 0, "
                           "candidate 375; change +inf; no interval: latencies must be finite and > 0 for a log ratio",
                           0.0, 375.0)]


def test_no_gates_is_inconclusive_never_a_pass():
    v = decide(even_arm("c"), even_arm("k"), GateConfig(**NO_TF, quality_margins_rel={}, control_agreement_min={},
                                                        latency_max_regression={}), False)
    assert (v.status, results(v)) == ("inconclusive", [("config", "", "inconclusive",
                                                        "no gates configured: nothing was checked", None, None)])


def test_verdict_table_and_json():
    v = decide(even_arm("c"), even_arm("k"), GateConfig(**NO_TF, quality_margins_rel={}, control_agreement_min={},
                                                        latency_max_regression={}, n_boot=50), False)
    assert verdict_table(v) == ("verdict: INCONCLUSIVE (exit 2)\n"
                                "  [inconclusive] config:  no gates configured: nothing was checked")
    d = decide(even_arm("c"), even_arm("k", extra={"perf/peak_mem_gb": float("inf")}),
               GateConfig(**NO_TF, memory_ceilings_gb={"perf/peak_mem_gb": 1}, quality_margins_rel={},
                          control_agreement_min={}, latency_max_regression={}), False).to_dict()
    assert d["gates"][0]["candidate"] is None  # not finite: JSON null, the reason says what it was


def test_different_traffic_is_refused_naming_both_digests():
    c, k = even_arm("c"), even_arm("k")
    c.requests_digest, k.requests_digest = "a" * 20, "b" * 20
    with pytest.raises(ValueError, match=re.escape(f"requests_digest differs (control {'a' * 16!r}, "
                                                   f"candidate {'b' * 16!r})")):
        decide(c, k, GateConfig(), False)


def test_the_parent_runs_verdict_metrics_carry_each_gates_change_interval_and_mde():
    from optladder.abtest.verdict import GateResult, Verdict
    from optladder.experiments.ab_run import gate_metrics

    iv = Interval(0.05, -0.02, 0.12, 20)
    v = Verdict("inconclusive", [GateResult("latency_max_regression", "perf/e2e_ms_p99", "inconclusive", "", 1.0, 1.05,
                                            iv, 0.10, mde=0.08, pairs_to_decide=9.0),
                                 GateResult("exact_match", "quality/exact_match_vs_control", "pass", "", None, 1.0)], 2)
    m = gate_metrics(v)
    name = "verdict/latency_max_regression/perf_e2e_ms_p99"
    assert m == {f"{name}_change": 0.05, f"{name}_low": -0.02, f"{name}_high": 0.12, f"{name}_mde": 0.08}
