"""The sweep summary on hand-made verdicts, exact results: which intervals count and which contain zero, the
run noise and the leave-one-out intervals (recomputed here from the t formula), the markdown table and
notes. tests/test_aa.py holds the statistical check on a simulated A/A sweep."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from optladder.abtest.sweep import GateSpread, SweepSummary, summarize, summary_markdown

LAT = "latency_max_regression:perf/e2e_ms_p99"


def ab(status, first, d, low, high, bound, estimate):
    return {"status": status, "first": first, "gates": [
        {"gate": "latency_max_regression", "metric": "perf/e2e_ms_p99", "status": status, "bound": bound,
         "interval": {"estimate": estimate, "low": low, "high": high, "pair_log_ratios": [d],
                      "request_var": 1e-6}},
        {"gate": "exact_match", "metric": "quality/exact_match_vs_control", "status": "pass", "interval": None},
        {"gate": "bleu", "metric": "quality/bleu_vs_ref", "status": "pass", "interval": {}}]}


SWEEP = [ab("fail", "control", 0.2, 0.1, 0.3, 0.2, 0.2),  # interval excludes 0
         ab("pass", "candidate", 0.0, 0.0, 0.5, 2.0, 0.1),  # low on 0: contains it
         ab("inconclusive", None, 0.01, -0.5, 0.0, 0.1, -0.1),  # high on 0: contains it; no opener recorded
         ab("inconclusive", "control", -0.01, None, None, None, None)]  # undefined interval, no bound


def loo(i: int, alpha: float, weight: float) -> tuple[float, float]:
    """Pair i's interval with the run noise of the other pairs: one pair of its own (no df), the prior's
    weight as the df, SD about 0 of the others' log ratios."""
    d = [v["gates"][0]["interval"]["pair_log_ratios"][0] for v in SWEEP]
    others = [x for j, x in enumerate(d) if j != i]
    sd2 = sum(x * x for x in others) / len(others)
    half = sps.t.ppf(1 - alpha / 2, weight) * math.sqrt(1e-6 + sd2)
    return math.expm1(d[i] - half), math.expm1(d[i] + half)


def test_summarize_counts_intervals_noise_and_leave_one_out_verdicts():
    s = summarize(SWEEP, alpha=0.1, weight=8.0)
    assert s.n == 4 and s.verdicts == {"fail": 1, "pass": 1, "inconclusive": 2}
    assert [g.gate for g in s.gates] == [LAT, "exact_match:quality/exact_match_vs_control", "bleu:quality/bleu_vs_ref"]
    lat, em, bleu = s.gates
    assert (lat.statuses, lat.estimates, lat.covers_zero, lat.intervals) == (
        {"fail": 1, "pass": 1, "inconclusive": 2}, [0.2, 0.1, -0.1], 2, 4)
    assert (em.statuses, em.estimates, em.covers_zero, em.intervals, em.noise) == ({"pass": 4}, [], 0, 0, None)
    assert bleu.intervals == 0 and bleu.noise is None
    assert lat.log_ratios == [0.2, 0.0, 0.01, -0.01]
    assert lat.by_opener == {"control": [0.2, -0.01], "candidate": [0.0], "?": [0.01]}
    assert lat.noise == (pytest.approx(math.sqrt((0.04 + 0.0001 + 0.0001) / 4), rel=1e-12), 4)
    ivs = [loo(i, 0.1, 8.0) for i in range(4)]
    # pair 0 against a bound of 0.2 sits just above it; the others straddle 0
    assert ivs[0][0] > 0.2 and all(lo <= 0 <= hi for lo, hi in ivs[1:])
    assert (lat.loo_intervals, lat.loo_covers_zero) == (4, 3)
    assert lat.loo_statuses == {"fail": 1, "pass": 1, "inconclusive": 1}  # the fourth has no bound


def test_summarize_leave_one_out_follows_alpha_and_weight():
    # pair 0's low end is above its bound only with alpha 0.1 and the prior weighted as 8 pairs
    assert loo(0, 0.05, 8.0)[0] < 0.2 and loo(0, 0.1, 3.0)[0] < 0.2
    assert summarize(SWEEP, alpha=0.05, weight=8.0).gates[0].loo_statuses.get("fail", 0) == 0
    assert summarize(SWEEP, alpha=0.1).gates[0].loo_statuses.get("fail", 0) == 0  # weight: the 3 other pairs


def test_summarize_needs_two_paired_gates_for_noise():
    two = summarize(SWEEP[:2]).gates[0]
    assert two.noise == (pytest.approx(math.sqrt(0.04 / 2), rel=1e-12), 2) and two.loo_intervals == 2
    one = summarize(SWEEP[:1]).gates[0]
    assert one.noise is None and one.loo_intervals == 0 and one.by_opener == {}


def test_summary_markdown_table_and_run_noise_notes():
    s = SweepSummary({"fail": 1, "inconclusive": 3}, [
        GateSpread("a:m1", {"pass": 2}, [0.01, -0.02, 0.03], 2, 3),
        GateSpread("b:m2", {"fail": 1, "inconclusive": 1}, [0.01, 0.03], 1, 2),
        GateSpread("c:m3", {"inconclusive": 1}, [0.05], 0, 1),
        GateSpread("d:m4", {"pass": 4}, [], 0, 0),
        GateSpread("e:m5", {}, [], 0, 0, [0.1, 0.3, -0.1], {"control": [0.1, 0.3], "candidate": [-0.1]},
                   (0.05, 4), 3, 4, {"fail": 1, "inconclusive": 2}),
    ], 4)
    # SD of [0.01, -0.02, 0.03] (ddof=1): sqrt(((1/300)^2 + (8/300)^2 + (7/300)^2) / 2) = 2.52%
    assert math.isclose(np.std([0.01, -0.02, 0.03], ddof=1), math.sqrt((1 + 64 + 49) / 2) / 300)
    assert summary_markdown(s, "A/A") == "\n".join([
        "## A/A: 4 A/Bs",
        "",
        "verdicts: pass 0, fail 1, inconclusive 3",
        "",
        "| gate | pass | fail | inconclusive | delta min | median | max | SD | intervals containing 0 |",
        "|---|---|---|---|---|---|---|---|---|",
        "| a:m1 | 2 | 0 | 0 | -2.00% | +1.00% | +3.00% | +2.52% | 2/3 |",
        "| b:m2 | 0 | 1 | 1 | +1.00% | +2.00% | +3.00% | +1.41% | 1/2 |",
        "| c:m3 | 0 | 0 | 1 | +5.00% | +5.00% | +5.00% | - | 0/1 |",
        "| d:m4 | 4 | 0 | 0 | - | - | - | - | - |",
        "| e:m5 | 0 | 0 | 0 | - | - | - | - | - |",
        "",
        "**e:m5** over run pairs: the SD of log(candidate / control) over 4 A/A pairs is 0.0500, the value for "
        "`gate.run_noise` (with `gate.run_noise_weight: 4`).",
        "Recomputed with the noise measured from the other A/As (leave one out): 3/4 intervals contain 0; "
        "verdicts pass 0, fail 1, inconclusive 2.",
        "- first pair opened by the candidate: mean change -9.52% over 1",  # expm1(-0.1)
        "- first pair opened by the control: mean change +22.14% over 2",  # expm1(0.2)
    ]) + "\n"


def test_summary_markdown_default_title_and_counts_missing_from_the_other_side():
    s = SweepSummary({"pass": 2}, [GateSpread("a:m", {}, [], 0, 0, [0.0, 0.0], {}, (0.0, 2), 2, 2,
                                              {"pass": 2})], 2)
    text = summary_markdown(s)
    assert text.startswith("## A/B sweep: 2 A/Bs\n\nverdicts: pass 2, fail 0, inconclusive 0\n")
    assert text.endswith("(leave one out): 2/2 intervals contain 0; verdicts pass 2, fail 0, inconclusive 0.\n")
