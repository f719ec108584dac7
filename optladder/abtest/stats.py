"""Paired bootstrap intervals for A/B deltas of means.

Both arms replay the identical requests and prompts, so every comparison is paired: a bootstrap
resample draws prompt (or request) indices once and applies them to both arms, which cancels the
per-item variation (long prompts are slow in both arms) that an unpaired test would count as noise.
Latency quantiles over repeated runs: optladder/abtest/run_pairs.py. No torch, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps


@dataclass
class Interval:
    """A point estimate with its (1 - alpha) interval over n paired samples."""

    estimate: float
    low: float
    high: float
    n: int


def _check_pair(control: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(control, dtype=np.float64).ravel()
    k = np.asarray(candidate, dtype=np.float64).ravel()
    if c.shape != k.shape:
        raise ValueError(f"paired samples differ in length: control {c.size}, candidate {k.size}")
    if c.size == 0:
        raise ValueError("paired samples are empty: nothing to compare")
    if not (np.isfinite(c).all() and np.isfinite(k).all()):
        raise ValueError("paired samples contain NaN or inf")
    return c, k


def bootstrap_mean_delta(control: np.ndarray, candidate: np.ndarray, n_boot: int = 2000,
                         seed: int = 0, alpha: float = 0.05, relative: bool = False) -> Interval:
    """Delta of the mean (candidate - control; relative: divided by control's mean) with its paired BCa
    bootstrap interval (scipy.stats.bootstrap, paired=True), for scores paired by prompt (quality)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    c, k = _check_pair(control, candidate)
    if relative and c.mean() == 0:
        raise ValueError("relative delta is undefined: the control statistic is 0")

    def delta(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        diff = b.mean(axis=axis) - a.mean(axis=axis)
        if not relative:
            return diff
        with np.errstate(divide="ignore", invalid="ignore"):
            return diff / a.mean(axis=axis)

    estimate = float(delta(c, k))
    shift = k - c
    same_shift = np.ptp(shift) == 0 and (not relative or shift[0] == 0)
    same_ratio = relative and (c != 0).all() and np.ptp(k / np.where(c == 0, 1.0, c)) == 0
    if same_shift or same_ratio:  # every resample gives the same delta: the interval is the point
        return Interval(estimate, estimate, estimate, c.size)
    res = sps.bootstrap((c, k), delta, paired=True, vectorized=True, n_resamples=n_boot,
                        confidence_level=1 - alpha, method="BCa", rng=np.random.default_rng(seed))
    low, high = res.confidence_interval
    if not (np.isfinite(low) and np.isfinite(high)):  # BCa undefined (e.g. a resample's control mean is 0)
        low, high = np.quantile(res.bootstrap_distribution, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
    return Interval(estimate=estimate, low=float(low), high=float(high), n=c.size)
