"""gate.run_noise pooled with A/A pairs measured beside the runs (optladder/abtest/verdict.py pooled_run_noise):
SD = sqrt((w x prior^2 + sum d^2) / (w + n)) per metric, and the weight the fewest pairs of any metric gives.
Every expected number below is worked by hand from the formula."""
from __future__ import annotations

import math

import pytest

from optladder.abtest.gates import GateConfig
from optladder.abtest.verdict import pooled_run_noise

E2E, TTFT = "perf/e2e_ms_p99", "perf/ttft_ms_p50"


def test_each_metric_pools_its_prior_with_its_own_pairs():
    cfg = GateConfig(run_noise={E2E: 0.1, TTFT: 0.2}, run_noise_weight=4.0)
    pooled, used = pooled_run_noise(cfg, {E2E: [0.3, -0.1], TTFT: [0.2, 0.2, -0.2]})
    # e2e: (4 x 0.01 + 0.09 + 0.01) / (4 + 2) = 0.14 / 6; ttft: (4 x 0.04 + 3 x 0.04) / (4 + 3) = 0.04
    assert pooled.run_noise[E2E] == pytest.approx(0.152752523, abs=1e-9)
    assert pooled.run_noise[TTFT] == pytest.approx(0.2, abs=1e-12)
    assert pooled.run_noise_weight == 6.0  # 4 + the fewest pairs of any metric (2), not 4 + 3
    assert used[E2E] == {"prior": 0.1, "prior_weight": 4.0, "pairs": 2,
                         "aa_rms": pytest.approx(math.sqrt(0.05)), "pooled": pooled.run_noise[E2E]}
    assert used[TTFT]["pairs"] == 3 and used[TTFT]["aa_rms"] == pytest.approx(0.2)
    assert cfg.run_noise == {E2E: 0.1, TTFT: 0.2} and cfg.run_noise_weight == 4.0  # the input is not changed


def test_a_metric_without_pairs_keeps_its_prior_and_holds_the_weight_down():
    cfg = GateConfig(run_noise={E2E: 0.1, TTFT: 0.2}, run_noise_weight=4.0)
    pooled, used = pooled_run_noise(cfg, {E2E: [0.3, -0.1, 0.1, 0.1], "perf/tpot_ms_p50": [0.5]})
    # e2e: (0.04 + 0.09 + 0.01 + 0.01 + 0.01) / 8 = 0.02
    assert pooled.run_noise[E2E] == pytest.approx(math.sqrt(0.02), abs=1e-12)
    assert pooled.run_noise[TTFT] == 0.2 and TTFT not in used
    assert pooled.run_noise_weight == 4.0  # ttft has 0 pairs: no metric is given degrees of freedom it lacks
    assert "perf/tpot_ms_p50" not in pooled.run_noise  # pairs of a metric without a prior are not gated on


def test_no_pairs_leaves_the_config_as_it_is():
    cfg = GateConfig(run_noise={E2E: 0.1}, run_noise_weight=4.0)
    assert pooled_run_noise(cfg, {}) == (cfg, {})
    assert pooled_run_noise(cfg, {E2E: []}) == (cfg, {})


def test_a_prior_of_weight_zero_is_the_pairs_own_rms():
    cfg = GateConfig(run_noise={E2E: 0.5}, run_noise_weight=0.0)
    pooled, _ = pooled_run_noise(cfg, {E2E: [0.3, -0.4]})
    assert pooled.run_noise[E2E] == pytest.approx(math.sqrt(0.25 / 2), abs=1e-12)  # (0.09 + 0.16) / 2
    assert pooled.run_noise_weight == 2.0
