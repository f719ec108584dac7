"""Verdict details at their boundaries: the interval a gate reports is the one it claims, the non-inferiority
margin on point values points the right way, exact agreement of exactly the required share passes."""
from __future__ import annotations

import numpy as np
import pytest

from abtest.gates import GateConfig
from abtest.stats import bootstrap_mean_delta
from abtest.verdict import decide
from tests.test_gates import arm, by_name


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
    cfg = GateConfig(alpha=0.10, control_agreement_min={})
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
