"""Paired intervals on synthetic numbers with known answers: the mean delta (scipy's paired BCa bootstrap,
checked against a hand-written paired percentile bootstrap) and the run-pair latency interval, whose A/A
coverage is simulated."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats as sps

from optladder.abtest.run_pairs import align_runs, pair_interval, run_noise_from_aa, t_interval
from optladder.abtest.stats import Interval, bootstrap_mean_delta
from optladder.traffic.request import RequestRecord


def rec(rid: str, ttft: float, e2e: float, out: int = 11, ok: bool = True) -> RequestRecord:
    return RequestRecord(id=rid, scheduled_at=0.0, input_tokens=8, requested_output_tokens=out,
                         sent_at=0.0, first_token_at=ttft, finished_at=e2e, output_tokens=out, ok=ok)


@pytest.fixture
def latencies() -> np.ndarray:
    # heavy-tailed and very unequal across requests, as real latencies are
    return np.random.default_rng(1).lognormal(mean=-1.0, sigma=0.8, size=300)


def percentile_bootstrap(c: np.ndarray, k: np.ndarray, n_boot: int, seed: int, alpha: float = 0.05):
    """The paired percentile bootstrap the gates used before scipy's: one index draw for both arms."""
    idx = np.random.default_rng(seed).integers(0, c.size, size=(n_boot, c.size))
    deltas = k[idx].mean(axis=1) - c[idx].mean(axis=1)
    return np.quantile(deltas, [alpha / 2, 1 - alpha / 2])


def test_scipy_bca_agrees_with_the_hand_written_paired_bootstrap_on_a_known_case() -> None:
    rng = np.random.default_rng(5)
    c = rng.normal(30.0, 8.0, 400)  # per-prompt scores, say
    k = c + rng.normal(0.5, 2.0, 400)  # a true shift of +0.5 with symmetric noise
    iv = bootstrap_mean_delta(c, k, n_boot=4000, seed=1)
    low, high = percentile_bootstrap(c, k, 4000, seed=2)
    se = np.std(k - c, ddof=1) / np.sqrt(c.size)  # normal theory, the known answer here
    width = 2 * 1.96 * se
    for got, ref, theory in ((iv.low, low, (k - c).mean() - 1.96 * se), (iv.high, high, (k - c).mean() + 1.96 * se)):
        assert abs(got - ref) < 0.1 * width and abs(got - theory) < 0.1 * width
    assert iv.estimate == pytest.approx((k - c).mean())


def test_identical_and_exactly_shifted_arms_give_point_intervals(latencies: np.ndarray) -> None:
    iv = bootstrap_mean_delta(latencies, latencies.copy())
    assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0)
    iv = bootstrap_mean_delta(latencies, latencies - 1.0)
    assert iv.estimate == pytest.approx(-1.0) and iv.low == pytest.approx(-1.0) and iv.high == pytest.approx(-1.0)
    iv = bootstrap_mean_delta(latencies, latencies * 0.5, relative=True)
    assert (iv.low, iv.high) == pytest.approx((-0.5, -0.5))


def test_mean_delta_relative_and_seeded(latencies: np.ndarray) -> None:
    cand = latencies * np.random.default_rng(3).normal(1.1, 0.1, latencies.size)
    a = bootstrap_mean_delta(latencies, cand, relative=True, seed=7)
    assert a == bootstrap_mean_delta(latencies, cand, relative=True, seed=7)
    assert isinstance(a, Interval) and a.n == 300
    assert a.low < 0.1 < a.high
    assert a.estimate == pytest.approx(cand.mean() / latencies.mean() - 1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(control=[1.0, 2.0], candidate=[1.0]), "differ in length"),
    (dict(control=[], candidate=[]), "empty"),
    (dict(control=[1.0], candidate=[1.0], alpha=0.0), "alpha"),
    (dict(control=[0.0, 0.0], candidate=[1.0, 1.0], relative=True), "control statistic is 0"),
    (dict(control=[1.0, np.nan], candidate=[1.0, 1.0]), "NaN"),
])
def test_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bootstrap_mean_delta(**kwargs)


def test_align_runs_keeps_requests_ok_everywhere_and_counts_drops() -> None:
    r0 = [rec("a", 0.1, 1.0), rec("b", 0.2, 2.0), rec("c", 0.3, 3.0), rec("d", 0.4, 4.0, ok=False),
          rec("e", 0.5, 5.0, out=1)]
    r1 = [rec("c", 0.15, 1.5), rec("a", 0.05, 0.5), rec("d", 0.2, 2.0), rec("e", 0.5, 5.0, out=1),
          rec("z", 0.1, 1.0)]
    values, dropped = align_runs([r0, r1], "e2e")
    assert values.tolist() == [[1.0, 3.0, 5.0], [0.5, 1.5, 5.0]]
    assert dropped == 3  # b missing in run 1, d failed in run 0, z missing in run 0
    values, dropped = align_runs([r0, r1], "tpot")
    np.testing.assert_allclose(values, [[0.09, 0.27], [0.045, 0.135]])
    assert dropped == 4  # e has one output token: no tpot
    with pytest.raises(ValueError, match="'itl'.*ttft, tpot, e2e"):
        align_runs([r0], "itl")
    with pytest.raises(ValueError, match="'a' appears twice"):
        align_runs([[rec("a", 0.1, 1.0), rec("a", 0.1, 1.0)]], "e2e")


def test_the_interval_does_not_depend_on_the_order_the_records_came_in(latencies: np.ndarray) -> None:
    # a verdict judged from the runs in memory (completion order) and again from their files must agree
    control = [rec(f"r{i:03d}", 0.1, float(x)) for i, x in enumerate(latencies)]
    candidate = [rec(f"r{i:03d}", 0.1, float(x) * (0.8 + 0.4 * (i % 3 == 0))) for i, x in enumerate(latencies)]
    shuffled = list(np.random.default_rng(4).permutation(len(control)))

    def interval(c, k):
        values, _ = align_runs([c, k], "e2e")
        return pair_interval(values[:1], values[1:], 0.99, 0.1, 4.0)

    a = interval(control, candidate)
    b = interval([control[i] for i in shuffled], [candidate[i] for i in reversed(shuffled)])
    assert (a.low, a.high, a.estimate) == (b.low, b.high, b.estimate)


@pytest.mark.parametrize("q", [None, 0.5, 0.99])
def test_halved_latency_in_every_run(latencies: np.ndarray, q) -> None:
    runs = np.stack([latencies, latencies * 1.05])
    iv = pair_interval(runs, runs * 0.5, q, prior_sd=1e-4, prior_weight=4)
    assert iv.estimate == pytest.approx(-0.5) and iv.pairs == 2 and iv.n == 300
    assert iv.low == pytest.approx(-0.5, abs=1e-3) and iv.high == pytest.approx(-0.5, abs=1e-3)


def test_one_pair_without_a_prior_has_no_interval(latencies: np.ndarray) -> None:
    with pytest.raises(ValueError, match="run-to-run noise is unmeasured"):
        pair_interval(latencies[None], latencies[None] * 1.2, 0.99, prior_sd=None, prior_weight=4)


def test_the_prior_and_the_pairs_own_spread_both_widen_it(latencies: np.ndarray) -> None:
    one = pair_interval(latencies[None], latencies[None].copy(), 0.99, prior_sd=0.1, prior_weight=4)
    assert one.low < 0 < one.high and one.run_sd == pytest.approx(0.1) and one.df == 4
    # two pairs that disagree (+20% and -20%): their spread enters, the prior still counts
    runs = np.stack([latencies, latencies])
    cand = np.stack([latencies * 1.2, latencies / 1.2])
    iv = pair_interval(runs, cand, 0.5, prior_sd=0.01, prior_weight=1)
    assert iv.df == 2 and iv.run_sd > 0.15 and iv.low < -0.2 and iv.high > 0.2


def simulate(rng, pairs: int, run_sd: float, slowdown: float = 0.0, prior=None, n: int = 32):
    """Runs as a shared CPU makes them: every request of a run shares the run's luck, and each request has
    a little of its own. The p99 of 32 requests is about their maximum, as in the default workload."""
    base = rng.lognormal(0.0, 0.6, n)

    def arm(factor: float) -> np.ndarray:
        luck = np.exp(rng.normal(0, run_sd / np.sqrt(2), (pairs, 1)))
        return base * factor * luck * rng.lognormal(0, 0.05, (pairs, n))

    sd, weight = prior or (None, 0)
    return pair_interval(arm(1.0), arm(1.0 + slowdown), 0.99, prior_sd=sd, prior_weight=weight, n_boot=200,
                         seed=int(rng.integers(1 << 30)))


@pytest.fixture(scope="module")
def calibrated():
    """What an A/A sweep of 20 seeds gives the gate: the noise of one pair, measured (two pairs each)."""
    rng = np.random.default_rng(10)
    sweep = [simulate(rng, 2, run_sd=0.08) for _ in range(20)]
    return run_noise_from_aa([d for iv in sweep for d in iv.pair_log_ratios])


@pytest.mark.parametrize("pairs", [1, 2])
def test_aa_intervals_cover_zero_about_95_percent_of_the_time(pairs: int, calibrated) -> None:
    rng = np.random.default_rng(11)
    ivs = [simulate(rng, pairs, run_sd=0.08, prior=calibrated) for _ in range(300)]
    coverage = np.mean([iv.low <= 0 <= iv.high for iv in ivs])
    assert 0.92 <= coverage <= 0.99, coverage
    # the bootstrap over requests alone (what the gate did before) misses zero far more often
    request_only = np.mean([abs(np.mean(iv.pair_log_ratios)) <= 1.96 * np.sqrt(iv.request_var) for iv in ivs])
    assert request_only < 0.6


def test_a_known_slowdown_is_detected(calibrated) -> None:
    rng = np.random.default_rng(12)
    ivs = [simulate(rng, 2, run_sd=0.08, slowdown=0.5, prior=calibrated) for _ in range(50)]
    assert np.mean([iv.low > 0.10 for iv in ivs]) > 0.9
    assert np.median([iv.estimate for iv in ivs]) == pytest.approx(0.5, abs=0.05)


def test_t_interval_pools_prior_and_pairs_exactly() -> None:
    # three pairs d = 0.1, 0.2, 0.3: own SS = 0.02 over 2 df; a prior SD 0.1 weighted as 4 pairs: run variance
    # (4 * 0.01 + 0.02) / 6 = 0.01; half width t(0.95, 6) * sqrt(1e-4 + 0.01 / 3) around the mean 0.2
    iv = t_interval(np.array([0.1, 0.2, 0.3]), 1e-4, 0.1, 4.0, alpha=0.1, n=7)
    half = sps.t.ppf(0.95, 6) * math.sqrt(1e-4 + 0.01 / 3)
    assert (iv.pairs, iv.n, iv.df, iv.request_var) == (3, 7, 6.0, 1e-4)
    assert iv.pair_log_ratios == [0.1, 0.2, 0.3]
    assert iv.run_sd == pytest.approx(0.1, rel=1e-12)
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((math.expm1(0.2), math.expm1(0.2 - half),
                                                           math.expm1(0.2 + half)), rel=1e-12)
    # no prior: the weight does not count, the pairs' own spread alone (SS 0.02 over 2 df)
    own = t_interval([0.1, 0.2, 0.3], 0.0, None, 4.0)
    assert own.df == 2 and own.run_sd == pytest.approx(0.1, rel=1e-12) and own.n == 0
    assert own.high == pytest.approx(math.expm1(0.2 + sps.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)), rel=1e-12)
    # one pair with a prior: the prior alone
    one = t_interval([0.05], 0.0, 0.02, 2.0)
    assert one.df == 2 and one.run_sd == pytest.approx(0.02, rel=1e-12)
    message = ("one run pair and no gate.run_noise prior: run-to-run noise is unmeasured "
               "(give ab.repeats >= 2, or gate.run_noise from an A/A sweep)")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        t_interval([0.05], 0.0, None, 4.0)


def test_run_noise_from_aa_is_the_rms_about_zero() -> None:
    assert run_noise_from_aa([0.3, -0.4]) == (pytest.approx(math.sqrt(0.125), rel=1e-12), 2)
    with pytest.raises(ValueError, match="^no A/A pairs to measure run noise from$"):
        run_noise_from_aa([])
