"""Paired bootstrap, record pairing and repeat pooling on synthetic numbers with known answers."""
from __future__ import annotations

import numpy as np
import pytest

from abtest.stats import (Interval, bootstrap_mean_delta, bootstrap_quantile_delta, pair_records,
                          pool_repeats)
from traffic.request import RequestRecord


def rec(rid: str, ttft: float, e2e: float, out: int = 11, ok: bool = True) -> RequestRecord:
    return RequestRecord(id=rid, scheduled_at=0.0, input_tokens=8, requested_output_tokens=out,
                         sent_at=0.0, first_token_at=ttft, finished_at=e2e, output_tokens=out, ok=ok)


@pytest.fixture
def latencies() -> np.ndarray:
    # heavy-tailed and very unequal across requests, as real latencies are
    return np.random.default_rng(1).lognormal(mean=-1.0, sigma=0.8, size=300)


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_halved_latency_gives_exactly_minus_half(latencies: np.ndarray, q: float) -> None:
    iv = bootstrap_quantile_delta(latencies, latencies * 0.5, q)
    assert isinstance(iv, Interval)
    assert iv.n == 300
    # every resample halves every value, so the interval collapses onto the answer
    assert iv.estimate == pytest.approx(-0.5, abs=1e-12)
    assert iv.low == pytest.approx(-0.5, abs=1e-12) and iv.high == pytest.approx(-0.5, abs=1e-12)


def test_identical_arms_give_zero_interval(latencies: np.ndarray) -> None:
    iv = bootstrap_quantile_delta(latencies, latencies.copy(), 0.99)
    assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0)
    iv = bootstrap_mean_delta(latencies, latencies.copy())
    assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0)


def test_absolute_deltas(latencies: np.ndarray) -> None:
    iv = bootstrap_quantile_delta(latencies, latencies + 0.25, 0.5, relative=False)
    assert iv.low == pytest.approx(0.25) and iv.high == pytest.approx(0.25)
    iv = bootstrap_mean_delta(latencies, latencies - 1.0)
    assert iv.estimate == pytest.approx(-1.0) and iv.low == pytest.approx(-1.0)


def test_noisy_interval_covers_truth_and_pairing_narrows_it(latencies: np.ndarray) -> None:
    noise = np.random.default_rng(2).normal(1.0, 0.05, latencies.size)
    iv = bootstrap_quantile_delta(latencies, latencies * 0.8 * noise, 0.5)
    assert iv.low < -0.2 < iv.high
    assert iv.high < 0  # a 20% gain is clearly detected
    # pairing removes the between-request spread (sigma 0.8) that dwarfs the per-request noise
    assert iv.high - iv.low < 0.05


def test_mean_delta_relative_and_seeded(latencies: np.ndarray) -> None:
    cand = latencies * np.random.default_rng(3).normal(1.1, 0.1, latencies.size)
    a = bootstrap_mean_delta(latencies, cand, relative=True, seed=7)
    b = bootstrap_mean_delta(latencies, cand, relative=True, seed=7)
    assert a == b
    assert a.low < 0.1 < a.high
    assert a.estimate == pytest.approx(cand.mean() / latencies.mean() - 1)


def test_large_trace_is_chunked_and_fast() -> None:
    x = np.random.default_rng(4).random(50_000) + 0.1
    iv = bootstrap_quantile_delta(x, x * 1.1, 0.99, n_boot=100)
    assert iv.low == pytest.approx(0.1) and iv.high == pytest.approx(0.1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(control=[1.0, 2.0], candidate=[1.0], q=0.5), "differ in length"),
    (dict(control=[], candidate=[], q=0.5), "empty"),
    (dict(control=[1.0], candidate=[1.0], q=1.5), "quantile q"),
    (dict(control=[1.0], candidate=[1.0], q=0.5, alpha=0.0), "alpha"),
    (dict(control=[0.0, 0.0], candidate=[1.0, 1.0], q=0.5), "control statistic is 0"),
    (dict(control=[1.0, np.nan], candidate=[1.0, 1.0], q=0.5), "NaN"),
])
def test_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bootstrap_quantile_delta(**kwargs)


def test_pair_records_aligns_by_id_and_counts_drops() -> None:
    control = [rec("a", 0.1, 1.0), rec("b", 0.2, 2.0), rec("c", 0.3, 3.0), rec("d", 0.4, 4.0, ok=False),
               rec("e", 0.5, 5.0, out=1)]
    candidate = [rec("c", 0.15, 1.5), rec("a", 0.05, 0.5), rec("d", 0.2, 2.0), rec("e", 0.5, 5.0, out=1),
                 rec("z", 0.1, 1.0)]
    c, k, dropped = pair_records(control, candidate, "e2e")
    assert c.tolist() == [1.0, 3.0, 5.0] and k.tolist() == [0.5, 1.5, 5.0]
    assert dropped == 3  # b missing in candidate, d failed in control, z missing in control
    c, k, dropped = pair_records(control, candidate, "tpot")
    assert c.tolist() == pytest.approx([0.09, 0.27]) and k.tolist() == pytest.approx([0.045, 0.135])
    assert dropped == 4  # e has one output token: no tpot


def test_pair_records_rejects_unknown_metric_and_duplicates() -> None:
    with pytest.raises(ValueError, match="'itl'.*ttft, tpot, e2e"):
        pair_records([], [], "itl")
    with pytest.raises(ValueError, match="'a' appears twice"):
        pair_records([rec("a", 0.1, 1.0), rec("a", 0.1, 1.0)], [], "e2e")


def test_pool_repeats_takes_median_per_request() -> None:
    repeats = [[rec("a", 0.1, 1.0), rec("b", 0.2, 2.0)],
               [rec("b", 0.4, 9.0), rec("a", 0.3, 1.2)],
               [rec("a", 0.2, 5.0), rec("b", 0.3, 2.2)]]
    pooled = {r.id: r for r in pool_repeats(repeats)}
    assert list(pooled) == ["a", "b"]
    a = pooled["a"]
    assert (a.ttft, a.e2e, a.repeats, a.ok) == (0.2, 1.2, 3, True)
    # tpot is the median of the repeats' tpots, not a value derived from the other two medians
    assert a.tpot == pytest.approx(np.median([0.09, 0.09, 0.48]))
    assert pooled["b"].e2e == 2.2
    c, k, dropped = pair_records(pool_repeats(repeats), repeats[0], "e2e")
    assert c.tolist() == [1.2, 2.2] and dropped == 0


def test_pool_repeats_marks_a_request_failed_or_missing_anywhere_as_failed() -> None:
    repeats = [[rec("a", 0.1, 1.0), rec("b", 0.2, 2.0)],
               [rec("a", 0.1, 1.0, ok=False), rec("b", 0.2, 2.0)],
               [rec("a", 0.1, 1.0)]]
    pooled = {r.id: r for r in pool_repeats(repeats)}
    assert not pooled["a"].ok and not pooled["b"].ok
    with pytest.raises(ValueError, match="no repeats"):
        pool_repeats([])
