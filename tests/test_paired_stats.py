"""The paired bootstrap of mean deltas through its public function (optladder/abtest/stats.py): its arguments and
samples checked, and the edges where every resample gives the same delta. Latency intervals over run
pairs: tests/test_aa.py and optladder/abtest/run_pairs.py."""
from __future__ import annotations

import re

import numpy as np
import pytest

from optladder.abtest.stats import Interval, bootstrap_mean_delta



@pytest.mark.parametrize("kwargs, message", [({"alpha": 0.0}, "alpha must be in (0, 1), got 0.0"),
                                             ({"alpha": 1.0}, "alpha must be in (0, 1), got 1.0"),
                                             ({"n_boot": 0}, "n_boot must be >= 1, got 0")])
def test_bootstrap_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        bootstrap_mean_delta(np.ones(5), np.ones(5), **kwargs)
    bootstrap_mean_delta(np.ones(5), np.ones(5), n_boot=1, alpha=0.999)  # the edges themselves are fine


@pytest.mark.parametrize("control, candidate, message", [
    (np.ones(3), np.ones(4), "paired samples differ in length: control 3, candidate 4"),
    (np.ones(0), np.ones(0), "paired samples are empty: nothing to compare"),
    (np.array([1.0, np.nan]), np.ones(2), "paired samples contain NaN or inf"),
    (np.ones(2), np.array([1.0, np.inf]), "paired samples contain NaN or inf")])
def test_paired_samples_are_checked(control, candidate, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        bootstrap_mean_delta(control, candidate)



def test_a_constant_shift_or_ratio_is_its_own_interval():
    c = np.array([1.0, 2.0, 5.0])
    assert bootstrap_mean_delta(c, c + 0.5) == Interval(0.5, 0.5, 0.5, 3)
    assert bootstrap_mean_delta(c, 2 * c, relative=True) == Interval(1.0, 1.0, 1.0, 3)
    with pytest.raises(ValueError, match="the control statistic is 0"):
        bootstrap_mean_delta(np.zeros(3), np.ones(3), relative=True)


def test_a_noisy_shift_gets_an_interval_around_it_that_narrows_with_more_pairs():
    rng = np.random.default_rng(2)
    widths = []
    for n in (20, 320):
        a = rng.normal(10, 1, n)
        iv = bootstrap_mean_delta(a, a + 0.5 + rng.normal(0, 0.3, n), n_boot=1000)
        assert iv.low < iv.estimate < iv.high and iv.low < 0.5 < iv.high and iv.n == n
        widths.append(iv.high - iv.low)
    assert widths[1] < widths[0] / 2  # about 1/sqrt(16) as wide


def test_power_says_what_a_run_resolves_and_how_many_pairs_would_decide_it():
    import math

    import numpy as np
    from scipy import stats as sps

    from optladder.abtest.run_pairs import PairInterval, power, t_interval

    d = np.array([0.10, 0.02, 0.06, 0.02])  # four pairs' log ratios, mean 0.05, no request noise
    iv = t_interval(d, 0.0, None, 0.0, alpha=0.05)
    sd = float(np.std(d, ddof=1))
    p = power(iv, 0.10, 1.0, 0.05, decided=False)
    assert p.mde == pytest.approx(math.expm1((sps.t.ppf(0.975, 3) + sps.t.ppf(0.8, 3)) * sd / 2), rel=1e-6)
    gap = math.log1p(0.10) - 0.05
    n = int(p.pairs_to_decide)
    assert n == math.ceil(sd ** 2 / (gap / sps.t.ppf(0.975, 3)) ** 2)
    assert sps.t.ppf(0.975, 3) * sd / math.sqrt(n) <= gap < sps.t.ppf(0.975, 3) * sd / math.sqrt(n - 1)
    assert power(iv, 0.10, 1.0, 0.05, decided=True).pairs_to_decide is None
    # request noise wider than the gap: the same requests in every pair, so no number of pairs decides
    wide = PairInterval(estimate=iv.estimate, low=iv.low, high=iv.high, n=20, pairs=4, request_var=0.01,
                        run_sd=sd, df=3)
    assert math.isinf(power(wide, 0.10, 1.0, 0.05, decided=False).pairs_to_decide)
