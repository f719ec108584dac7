"""Paired bootstrap intervals for A/B deltas, and the pairing of two arms' request records.

Both arms replay the identical requests and prompts, so every comparison is paired: a bootstrap
resample draws request (or prompt) indices once and applies them to both arms, which cancels the
per-request variation (long prompts are slow in both arms) that an unpaired test would count as noise.
Pure numpy: no torch, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from traffic.request import RequestRecord

PAIRED_METRICS = ("ttft", "tpot", "e2e")
# Resample in chunks so a long trace (1e5 requests x 2000 resamples) never builds one huge matrix.
_MAX_CHUNK_ELEMENTS = 2_000_000


@dataclass
class Interval:
    """A point estimate with its (1 - alpha) percentile-bootstrap interval over n paired samples."""

    estimate: float
    low: float
    high: float
    n: int


class Paired(NamedTuple):
    """Per-request values of one metric, aligned by request id (seconds)."""

    control: np.ndarray
    candidate: np.ndarray
    dropped: int


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


def _delta(ctrl_stat: np.ndarray, cand_stat: np.ndarray, relative: bool) -> np.ndarray:
    if not relative:
        return cand_stat - ctrl_stat
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (cand_stat - ctrl_stat) / ctrl_stat
    # A resample whose control statistic is 0 and unchanged has no change, not an undefined one.
    return np.where((ctrl_stat == 0) & (cand_stat == 0), 0.0, d)


def _paired_bootstrap(control: np.ndarray, candidate: np.ndarray,
                      stat: Callable[[np.ndarray], np.ndarray], n_boot: int, seed: int,
                      alpha: float, relative: bool) -> Interval:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    c, k = _check_pair(control, candidate)
    point_c, point_k = stat(c[None, :])[0], stat(k[None, :])[0]
    if relative and point_c == 0:
        raise ValueError("relative delta is undefined: the control statistic is 0")
    rng = np.random.default_rng(seed)
    n = c.size
    chunk = max(1, _MAX_CHUNK_ELEMENTS // n)
    deltas = []
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - start), n))
        deltas.append(_delta(stat(c[idx]), stat(k[idx]), relative))
    boot = np.concatenate(deltas)
    # inverted_cdf picks real order statistics: no interpolation, so an inf from a resample whose
    # control statistic is 0 cannot turn an endpoint into NaN.
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
    estimate = float(_delta(np.array([point_c]), np.array([point_k]), relative)[0])
    return Interval(estimate=estimate, low=float(low), high=float(high), n=n)


def bootstrap_quantile_delta(control: np.ndarray, candidate: np.ndarray, q: float,
                             n_boot: int = 2000, seed: int = 0, alpha: float = 0.05,
                             relative: bool = True) -> Interval:
    """Delta of the q-th quantile (candidate - control; relative: divided by control's), for latency
    samples paired by request: element i of both arrays is the same request."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    return _paired_bootstrap(control, candidate, lambda a: np.quantile(a, q, axis=1),
                             n_boot, seed, alpha, relative)


def bootstrap_mean_delta(control: np.ndarray, candidate: np.ndarray, n_boot: int = 2000,
                         seed: int = 0, alpha: float = 0.05, relative: bool = False) -> Interval:
    """Delta of the mean (candidate - control; relative: divided by control's mean), for scores
    paired by prompt (quality) or by request (mean latency)."""
    return _paired_bootstrap(control, candidate, lambda a: a.mean(axis=1),
                             n_boot, seed, alpha, relative)


def _by_id(records: list[RequestRecord], arm: str) -> dict[str, RequestRecord]:
    out: dict[str, RequestRecord] = {}
    for r in records:
        if r.id in out:
            raise ValueError(f"{arm} arm: request id {r.id!r} appears twice; pool repeats first")
        out[r.id] = r
    return out


def pair_records(control_records: list[RequestRecord], candidate_records: list[RequestRecord],
                 metric: str) -> Paired:
    """Align two arms' records by request id for one of ttft, tpot, e2e (seconds). A request that is
    missing from an arm, failed in either, or has no value (tpot with one output token) is dropped;
    `dropped` counts them over the union of ids. Order follows the control arm."""
    if metric not in PAIRED_METRICS:
        raise ValueError(f"unknown paired metric {metric!r}; valid: {', '.join(PAIRED_METRICS)}")
    ctrl, cand = _by_id(control_records, "control"), _by_id(candidate_records, "candidate")
    xs, ys = [], []
    for rid, rc in ctrl.items():
        rk = cand.get(rid)
        if rk is None or not (rc.ok and rk.ok):
            continue
        vc, vk = getattr(rc, metric), getattr(rk, metric)
        if vc is None or vk is None:
            continue
        xs.append(vc)
        ys.append(vk)
    dropped = len(ctrl.keys() | cand.keys()) - len(xs)
    return Paired(np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64), dropped)


@dataclass
class PooledRecord(RequestRecord):
    """A request's record pooled over repeats: ttft, tpot and e2e are each the median over repeats.
    The three medians are stored, because no single timeline has all three as its values."""

    repeats: int = 1
    ttft_median: float | None = None
    tpot_median: float | None = None
    e2e_median: float | None = None

    @property
    def ttft(self) -> float | None:
        return self.ttft_median

    @property
    def tpot(self) -> float | None:
        return self.tpot_median

    @property
    def e2e(self) -> float | None:
        return self.e2e_median


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.median(vals)) if vals else None


def _pool_one(rs: list[RequestRecord], n_repeats: int) -> PooledRecord:
    first = rs[0]
    # A request that failed or went missing in any repeat is not comparable: mark it failed so
    # pair_records drops (and counts) it rather than comparing medians over different repeats.
    ok = len(rs) == n_repeats and all(r.ok for r in rs)
    ttft, tpot, e2e = (_median([getattr(r, m) for r in rs]) for m in PAIRED_METRICS)
    sent = _median([r.sent_at for r in rs])
    return PooledRecord(
        id=first.id, scheduled_at=first.scheduled_at, input_tokens=first.input_tokens,
        requested_output_tokens=first.requested_output_tokens, sent_at=sent,
        # timestamps consistent with the medians, so makespan-style metrics stay meaningful
        first_token_at=None if sent is None or ttft is None else sent + ttft,
        finished_at=None if sent is None or e2e is None else sent + e2e,
        output_tokens=int(np.median([r.output_tokens for r in rs])), ok=ok,
        error=next((r.error for r in rs if r.error), None), output_text=first.output_text,
        preemptions=max(r.preemptions for r in rs), repeats=len(rs),
        ttft_median=ttft, tpot_median=tpot, e2e_median=e2e)


def pool_repeats(repeats: list[list[RequestRecord]]) -> list[PooledRecord]:
    """Pool one arm's alternating repeats per request id, taking the median over repeats, so one slow
    repeat (machine drift, a noisy neighbour) does not decide the comparison. Order: first repeat."""
    if not repeats:
        raise ValueError("pool_repeats: no repeats given")
    groups: dict[str, list[RequestRecord]] = {}
    for i, recs in enumerate(repeats):
        for r in _by_id(recs, f"repeat {i}").values():
            groups.setdefault(r.id, []).append(r)
    return [_pool_one(rs, len(repeats)) for rs in groups.values()]
