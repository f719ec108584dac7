"""Latency intervals that count run-to-run noise, not only request-to-request noise.

Every request of one run shares that run's luck: a neighbour on the CPU, the allocator's state, the
clock. A bootstrap over the requests of one run per arm cannot see it, so on identical arms it gave
intervals that excluded zero (E2E p99 +2.97%, 95% interval [+2.86%, +4.03%], SmolLM2 on a CPU). Here the
unit of replication is a *pair* of runs, one per arm, run back to back (optladder/experiments/ab_run.py alternates
which arm opens a pair). For pair j, d_j = log(stat(candidate run j) / stat(control run j)) over the same
requests; the change is exp(mean d_j) - 1 and its interval is a t interval whose variance has two parts:

- requests: a paired bootstrap over request indices, drawn once and applied to every run of both arms;
- runs: the spread of d_j over the pairs, pooled with a prior from an A/A sweep on the same kind of
  machine (`gate.run_noise[metric]`, the SD of d over identical arms; `gate.run_noise_weight` pairs' worth).
  With one pair and no prior there is nothing to say about run noise: the interval is undefined.

No torch, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as sps

from optladder.abtest.stats import Interval
from optladder.traffic.request import RequestRecord

_MAX_CHUNK_ELEMENTS = 2_000_000


@dataclass
class PairInterval(Interval):
    """An Interval of a relative change over run pairs, with what it was built from (verdict.json keeps it,
    so an A/A sweep can recompute its coverage under another prior)."""

    pairs: int = 0
    pair_log_ratios: list[float] = field(default_factory=list)
    request_var: float = 0.0  # variance of mean d from resampling requests
    run_sd: float = 0.0  # the pooled SD of one pair's d (prior and pairs)
    df: float = 0.0


PAIRED_METRICS = ("ttft", "tpot", "e2e")


def align_runs(runs: list[list[RequestRecord]], metric: str) -> tuple[np.ndarray, int]:
    """(runs x requests) of one of ttft, tpot, e2e (seconds), column i the same request in every run:
    the requests that are ok and have a value in every run, in the order of their ids (so the seeded bootstrap
    resamples the same columns whatever order the records came in: a verdict judged from the runs in memory and
    again from their files agrees exactly). Also returns how many ids of the union were dropped (missing
    somewhere, failed somewhere, or tpot of one token)."""
    if metric not in PAIRED_METRICS:
        raise ValueError(f"unknown paired metric {metric!r}; valid: {', '.join(PAIRED_METRICS)}")
    by_id = []
    for i, recs in enumerate(runs):
        d: dict[str, RequestRecord] = {}
        for r in recs:
            if r.id in d:
                raise ValueError(f"run {i}: request id {r.id!r} appears twice")
            d[r.id] = r
        by_id.append(d)
    union = set().union(*by_id) if by_id else set()
    ids = [rid for rid in sorted(by_id[0]) if all(rid in d and d[rid].ok and getattr(d[rid], metric) is not None
                                          for d in by_id)] if by_id else []
    values = np.array([[getattr(d[rid], metric) for rid in ids] for d in by_id], dtype=np.float64)
    return values.reshape(len(runs), len(ids)), len(union) - len(ids)


def _stat(x: np.ndarray, q: float | None) -> np.ndarray:
    """Per row (the last axis are requests): the q-quantile, or the mean when q is None."""
    return x.mean(axis=-1) if q is None else np.quantile(x, q, axis=-1)


def pair_interval(control: np.ndarray, candidate: np.ndarray, q: float | None, prior_sd: float | None,
                  prior_weight: float, alpha: float = 0.05, n_boot: int = 2000, seed: int = 0) -> PairInterval:
    """Relative change of the q-quantile (mean: q=None) of candidate vs control, over run pairs.
    control, candidate: (pairs x requests), column i the same request everywhere, row j the same pair."""
    c, k = np.asarray(control, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    if c.shape != k.shape or c.ndim != 2 or c.size == 0:
        raise ValueError(f"run pairs must be two equal (pairs x requests) matrices, got {c.shape} and {k.shape}")
    if (c <= 0).any() or (k <= 0).any() or not (np.isfinite(c).all() and np.isfinite(k).all()):
        raise ValueError("latencies must be finite and > 0 for a log ratio")
    pairs, n = c.shape
    d = np.log(_stat(k, q)) - np.log(_stat(c, q))  # one log ratio per pair
    rng = np.random.default_rng(seed)
    boot = []
    chunk = max(1, _MAX_CHUNK_ELEMENTS // (pairs * n))
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - start), n))  # the same requests in every run
        boot.append((np.log(_stat(k[:, idx], q)) - np.log(_stat(c[:, idx], q))).mean(axis=0))
    request_var = float(np.var(np.concatenate(boot), ddof=1)) if n_boot > 1 else 0.0
    return t_interval(d, request_var, prior_sd, prior_weight, alpha, n)


def t_interval(d: np.ndarray, request_var: float, prior_sd: float | None, prior_weight: float,
               alpha: float = 0.05, n: int = 0) -> PairInterval:
    """The interval from the pairs' log ratios `d` and the request-resampling variance of their mean (also
    how an A/A sweep recomputes an interval under another prior)."""
    d = np.asarray(d, dtype=np.float64)
    pairs = d.size
    own_df = pairs - 1
    weight = prior_weight if prior_sd is not None else 0.0
    df = weight + own_df
    if df <= 0:
        raise ValueError("one run pair and no gate.run_noise prior: run-to-run noise is unmeasured "
                         "(give ab.repeats >= 2, or gate.run_noise from an A/A sweep)")
    own_ss = float(np.var(d, ddof=1)) * own_df if own_df > 0 else 0.0
    run_var = (weight * (prior_sd or 0.0) ** 2 + own_ss) / df
    half = float(sps.t.ppf(1 - alpha / 2, df)) * math.sqrt(request_var + run_var / pairs)
    mean = float(d.mean())
    return PairInterval(estimate=math.expm1(mean), low=math.expm1(mean - half), high=math.expm1(mean + half),
                        n=n, pairs=pairs, pair_log_ratios=[float(x) for x in d], request_var=request_var,
                        run_sd=math.sqrt(run_var), df=df)

@dataclass
class Power:
    """What a latency gate's run could resolve: mde, the smallest true change (relative, either way) it would
    detect with 80% power at its alpha; pairs_to_decide, about how many run pairs (in all) its interval would need
    to clear the bound at the estimate seen (None: decided already; inf: the estimate lies on the bound)."""

    mde: float
    pairs_to_decide: float | None


def power(iv: PairInterval, bound: float, sign: float, alpha: float, decided: bool) -> Power:
    """From the interval's own variance: SE = sqrt(request_var + run_sd^2 / pairs) of the mean log ratio, and the
    t distribution of the interval's df: MDE = (t[1 - alpha/2] + t[0.8]) x SE. More pairs shrink only the run
    part (every pair replays the same requests, so the request part repeats): the interval clears the bound at
    the estimate seen once t x sqrt(request_var + run_sd^2 / n) < gap, i.e. n > run_sd^2 / ((gap / t)^2 -
    request_var), and never where the request part alone is wider than the gap (inf)."""
    df = max(iv.df, 1.0)
    se = math.sqrt(iv.request_var + iv.run_sd ** 2 / max(iv.pairs, 1))
    mde = math.expm1((float(sps.t.ppf(1 - alpha / 2, df)) + float(sps.t.ppf(0.8, df))) * se)
    if decided:
        return Power(mde, None)
    gap = abs(math.log1p(bound) - sign * math.log1p(iv.estimate)) if bound > -1 else 0.0
    room = (gap / float(sps.t.ppf(1 - alpha / 2, df))) ** 2 - iv.request_var
    if room <= 0:
        return Power(mde, math.inf)
    return Power(mde, float(max(iv.pairs + 1, math.ceil(iv.run_sd ** 2 / room))))


def run_noise_from_aa(log_ratios: list[float]) -> tuple[float, int]:
    """The prior for gate.run_noise from an A/A sweep's pair log ratios (identical arms, so the true ratio is
    1 and the SD is taken about 0, one degree of freedom per pair): (SD, number of pairs)."""
    d = np.asarray(log_ratios, dtype=np.float64)
    if d.size == 0:
        raise ValueError("no A/A pairs to measure run noise from")
    return float(np.sqrt(np.mean(d ** 2))), int(d.size)


def block_interval(control: list[np.ndarray], candidate: list[np.ndarray], q: float | None, alpha: float = 0.05,
                   n_boot: int = 2000, seed: int = 0) -> PairInterval:
    """Relative change of the q-quantile (mean: q=None) of candidate vs control in a switchback
    (optladder/experiments/switchback.py): block b's requests replayed on both arms back to back, control[b] and
    candidate[b] their latencies, request i the same request in both. The change is that of the pooled statistic
    (every block's requests together); its SE comes from resampling whole blocks (a cluster bootstrap, scaled by
    sqrt(B / (B - 1)) for the few clusters), and the interval is a t interval with B - 1 df: the block is the unit
    of replication, so what drifts between blocks and what differs between their requests are both in it.
    pair_log_ratios holds each block's own log ratio (to look at); run_sd is SE x sqrt(B), so that
    power() reads the blocks as pairs."""
    blocks = len(control)
    if blocks != len(candidate) or blocks < 2:
        raise ValueError(f"a switchback interval needs the same >= 2 blocks in both arms, got {len(control)} and "
                         f"{len(candidate)}")
    c = [np.asarray(x, dtype=np.float64) for x in control]
    k = [np.asarray(x, dtype=np.float64) for x in candidate]
    for i, (a, b) in enumerate(zip(c, k)):
        if a.shape != b.shape or a.ndim != 1 or a.size == 0:
            raise ValueError(f"block {i}: the arms' latencies must be two equal non-empty vectors, got {a.shape} "
                             f"and {b.shape}")
        if (a <= 0).any() or (b <= 0).any() or not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ValueError("latencies must be finite and > 0 for a log ratio")

    def log_ratio(idx) -> float:
        kk, cc = np.concatenate([k[i] for i in idx]), np.concatenate([c[i] for i in idx])
        return float(np.log(_stat(kk, q)) - np.log(_stat(cc, q)))

    d = log_ratio(range(blocks))
    per_block = [float(np.log(_stat(k[i], q)) - np.log(_stat(c[i], q))) for i in range(blocks)]
    rng = np.random.default_rng(seed)
    boot = np.array([log_ratio(rng.integers(0, blocks, size=blocks)) for _ in range(n_boot)])
    se = float(np.std(boot, ddof=1)) * math.sqrt(blocks / (blocks - 1)) if n_boot > 1 else 0.0
    df = float(blocks - 1)
    half = float(sps.t.ppf(1 - alpha / 2, df)) * se
    n = int(sum(x.size for x in c))
    return PairInterval(estimate=math.expm1(d), low=math.expm1(d - half), high=math.expm1(d + half), n=n,
                        pairs=blocks, pair_log_ratios=per_block, request_var=0.0, run_sd=se * math.sqrt(blocks),
                        df=df)
