"""Open-loop arrival schedules: seconds after the replay's start at which each request is sent.

Every schedule starts with its first request at 0.0, so a replay never opens with idle time and the
duration of a schedule is the time of its last request; the mean rate of n arrivals is (n - 1) / that.
Poisson arrivals have exponential gaps (CV 1); gamma gaps have the same mean 1/rate and a chosen
coefficient of variation (CV > 1 is burstier than Poisson, CV < 1 more regular). Trace arrivals keep a
trace's own gaps, stretched or compressed by `time_scale` (2.0 replays twice as slowly).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _count(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"number of arrivals n must be an integer >= 1, got {n!r}")


def _from_gaps(gaps: np.ndarray) -> list[float]:
    return np.concatenate([[0.0], np.cumsum(gaps)]).tolist()


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """n arrival times of a seeded Poisson process at `rate` requests/s, the first at 0."""
    _count(n)
    _positive("rate", rate)
    rng = np.random.default_rng(seed)
    return _from_gaps(rng.exponential(1.0 / rate, size=n - 1))


def gamma_arrivals(n: int, rate: float, cv: float, seed: int) -> list[float]:
    """n arrival times with gamma-distributed gaps: mean 1/rate, coefficient of variation cv."""
    _count(n)
    _positive("rate", rate)
    _positive("cv", cv)
    shape = 1.0 / (cv * cv)  # gamma: CV = 1/sqrt(shape); mean = shape * scale
    rng = np.random.default_rng(seed)
    return _from_gaps(rng.gamma(shape, 1.0 / (rate * shape), size=n - 1))


def trace_arrivals(timestamps: Sequence[float], time_scale: float = 1.0) -> list[float]:
    """A trace's own timing, relative to its first timestamp, every gap multiplied by time_scale."""
    _positive("time_scale", time_scale)
    if len(timestamps) == 0:
        raise ValueError("trace_arrivals needs at least one timestamp")
    t = np.asarray(timestamps, dtype=np.float64)
    if np.any(np.diff(t) < 0):
        raise ValueError("trace_arrivals needs timestamps in time order (load_trace sorts them)")
    return ((t - t[0]) * time_scale).tolist()


def mean_rate(schedule: Sequence[float]) -> float:
    """Requests per second of a schedule, (n - 1) / duration; 0.0 when it has no duration."""
    duration = schedule[-1] - schedule[0] if len(schedule) > 1 else 0.0
    return (len(schedule) - 1) / duration if duration > 0 else 0.0
