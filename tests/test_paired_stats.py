"""Paired statistics through their public functions (abtest/stats.py): pairing by request id, pooling
repeats, and the bootstrap's edges (arguments, zeros, chunking, order statistics)."""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import abtest.stats as stats
from abtest.stats import PooledRecord, bootstrap_mean_delta, bootstrap_quantile_delta, pair_records, pool_repeats
from traffic.request import RequestRecord


def rec(rid: str, e2e: float | None, ok: bool = True, sent: float = 1.0, tokens: int = 4, **kw) -> RequestRecord:
    done = None if e2e is None else sent + e2e
    first = None if e2e is None else sent + e2e / 4
    return RequestRecord(rid, 0.5, 8, 4, sent_at=sent, first_token_at=first, finished_at=done, output_tokens=tokens,
                         ok=ok, **kw)


def test_pairing_keeps_control_order_and_counts_every_request_it_drops():
    control = [rec("a", 1.0), rec("b", 2.0), rec("c", 3.0, ok=False), rec("d", 4.0), rec("e", 5.0, tokens=1)]
    candidate = [rec("e", 2.5, tokens=1), rec("d", 2.0), rec("b", 1.0), rec("c", 1.5), rec("z", 9.0)]
    p = pair_records(control, candidate, "e2e")
    assert p.control.tolist() == [2.0, 4.0, 5.0] and p.candidate.tolist() == [1.0, 2.0, 2.5]
    assert p.control.dtype == p.candidate.dtype == np.float64
    assert p.dropped == 3  # a (no candidate), c (failed), z (no control)
    tpot = pair_records(control, candidate, "tpot")  # e has one output token: no TPOT, dropped, the rest kept
    assert tpot.control.tolist() == pytest.approx([2.0 * 0.75 / 3, 4.0 * 0.75 / 3]) and tpot.dropped == 4


def test_pairing_refuses_unknown_metrics_and_repeated_ids_naming_the_arm():
    with pytest.raises(ValueError, match=re.escape("unknown paired metric 'itl'; valid: ttft, tpot, e2e")):
        pair_records([], [], "itl")
    with pytest.raises(ValueError, match=re.escape("control arm: request id 'a' appears twice; pool repeats first")):
        pair_records([rec("a", 1.0), rec("a", 2.0)], [], "e2e")
    with pytest.raises(ValueError, match=re.escape("candidate arm: request id 'b' appears twice")):
        pair_records([], [rec("b", 1.0), rec("b", 2.0)], "e2e")
    with pytest.raises(ValueError, match=re.escape("repeat 1 arm: request id 'x' appears twice")):
        pool_repeats([[rec("x", 1.0)], [rec("x", 1.0), rec("x", 2.0)]])
    with pytest.raises(ValueError, match=re.escape("pool_repeats: no repeats given")):
        pool_repeats([])


def test_pooling_takes_the_median_per_request_with_consistent_timestamps():
    reps = [[rec("a", 1.0, sent=1.0, tokens=4, preemptions=0, output_text="x")],
            [rec("a", 3.0, sent=2.0, tokens=6, preemptions=2, error="slow", output_text="y")],
            [rec("a", 2.0, sent=3.0, tokens=5, preemptions=1, output_text="z")]]
    (pooled,) = pool_repeats(reps)
    assert pooled == PooledRecord(
        id="a", scheduled_at=0.5, input_tokens=8, requested_output_tokens=4, sent_at=2.0, first_token_at=2.5,
        finished_at=4.0, output_tokens=5, ok=True, error="slow", output_text="x", preemptions=2, repeats=3,
        ttft_median=0.5, tpot_median=0.375, e2e_median=2.0)  # TPOTs 0.25, 0.45, 0.375 (E2E x 0.75 / (tokens - 1))
    assert (pooled.ttft, pooled.tpot, pooled.e2e) == (0.5, 0.375, 2.0)


def test_a_request_failed_or_missing_in_any_repeat_is_failed_and_unsent_has_no_times():
    pooled = {p.id: p for p in pool_repeats([[rec("a", 1.0), rec("b", 1.0)], [rec("a", 1.0, ok=False)]])}
    assert not pooled["a"].ok and not pooled["b"].ok and pooled["b"].repeats == 1
    unsent = RequestRecord("u", 0.0, 8, 4)
    (p,) = pool_repeats([[unsent], [unsent]])
    assert (p.sent_at, p.first_token_at, p.finished_at, p.ttft, p.e2e) == (None, None, None, None, None)
    half = RequestRecord("h", 0.0, 8, 4, sent_at=1.0, first_token_at=1.5, ok=False)  # first token, never finished
    (p,) = pool_repeats([[half]])
    assert (p.first_token_at, p.finished_at) == (1.5, None)


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


@pytest.mark.parametrize("q", [0.0, 1.0])
def test_quantiles_at_both_ends_are_allowed(q):
    iv = bootstrap_quantile_delta(np.arange(1.0, 11.0), 2 * np.arange(1.0, 11.0), q, n_boot=50)
    assert iv.estimate == pytest.approx(1.0)
    with pytest.raises(ValueError, match=re.escape("quantile q must be in [0, 1], got 1.5")):
        bootstrap_quantile_delta(np.ones(3), np.ones(3), 1.5)


def test_resamples_whose_control_is_zero_count_as_no_change_quietly():
    control = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0/0 inside the resamples must not even warn
        iv = bootstrap_quantile_delta(control, 2 * control, 0.5, n_boot=500)
    assert (iv.estimate, iv.low, iv.high) == (1.0, 0.0, 1.0)


def test_every_sample_can_be_drawn_and_defaults_are_the_documented_ones():
    control, candidate = np.zeros(50), np.zeros(50)
    candidate[0] = 100.0  # only the first pair differs
    iv = bootstrap_mean_delta(control, candidate, n_boot=400, alpha=0.1)
    assert iv.high > iv.low >= 0.0 and iv.high >= 4.0  # resamples that draw it twice or more
    rng = np.random.default_rng(1)
    a, b = rng.normal(10, 1, 40), rng.normal(10.5, 1, 40)
    assert bootstrap_mean_delta(a, b) == bootstrap_mean_delta(a, b, n_boot=2000, seed=0, alpha=0.05, relative=False)
    assert bootstrap_quantile_delta(a, b, 0.9) == bootstrap_quantile_delta(a, b, 0.9, n_boot=2000, seed=0, alpha=0.05,
                                                                           relative=True)


def test_endpoints_are_resampled_values_not_interpolations():
    """With two pairs the mean delta of a resample is 0, 0.5 or 1; an endpoint is one of them."""
    for seed in range(20):
        iv = bootstrap_mean_delta(np.zeros(2), np.array([0.0, 1.0]), n_boot=7, seed=seed, alpha=0.3)
        assert {iv.low, iv.high} <= {0.0, 0.5, 1.0}, seed


def test_chunked_resampling_gives_the_same_interval(monkeypatch):
    """Long traces are resampled in chunks to bound memory; the chunks must add up to the same resamples."""
    rng = np.random.default_rng(2)
    a, b = rng.normal(10, 1, 10), rng.normal(11, 1, 10)
    whole = bootstrap_mean_delta(a, b, n_boot=12)
    monkeypatch.setattr(stats, "_MAX_CHUNK_ELEMENTS", 50)  # 5 resamples a chunk: 5 + 5 + 2
    assert bootstrap_mean_delta(a, b, n_boot=12) == whole
