"""Distribution-preserving samples of a trace, and fitting lengths to a model's context.

Latency depends on input and output length together (a long prompt with a short answer is a
prefill-bound request, the reverse a decode-bound one), so `stratified_sample` keeps their joint
distribution: rows are binned on quantiles of both lengths, each cell gets its proportional share of
the sample (largest-remainder rounding, so the shares add up to exactly n) and is sampled at random.
`window_sample` keeps instead what a stratified sample loses, the trace's burstiness: n consecutive rows.

`fit_lengths` then makes every row fit the model's context; `changed_shares` says what share of the
input and of the output lengths it changed. Above `LENGTHS_CHANGED_WARN` (5%) of either, the replay no
longer has the trace's lengths, and a workload says so (a warning, a run tag, a line in results.md).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from optladder.traffic.traces import TraceRow

LENGTH_POLICIES = ("clip", "scale")
MAX_BINS = 10  # per length: 10 x 10 cells keeps each marginal within a decile before within-cell noise
# Share of input (or output) lengths the length policy may change before a replay is flagged as not having
# the trace's lengths: 1 in 20 moves an ECDF by at most 0.05, the KS distance of a good 500-row sample.
LENGTHS_CHANGED_WARN = 0.05


def _check_n(rows: Sequence[TraceRow], n: int) -> None:
    if n < 1:
        raise ValueError(f"sample size n must be >= 1, got {n}")
    if not rows:
        raise ValueError("cannot sample from an empty trace")


def _quantile_bins(values: np.ndarray, k: int) -> np.ndarray:
    """Bin index of each value on k quantile bins; tied values share a bin, so bins may merge."""
    edges = np.unique(np.quantile(values, np.linspace(0, 1, k + 1)[1:-1]))
    return np.searchsorted(edges, values, side="right")


def _largest_remainder(sizes: np.ndarray, n: int) -> np.ndarray:
    """Integer shares of n proportional to sizes, summing to exactly n and never above a size."""
    quota = sizes * (n / sizes.sum())
    alloc = np.minimum(np.floor(quota).astype(int), sizes)
    order = np.argsort(-(quota - alloc), kind="stable")
    while alloc.sum() < n:  # at most a few passes: each hands one more to every cell with room
        for i in order:
            if alloc.sum() == n:
                break
            if alloc[i] < sizes[i]:
                alloc[i] += 1
    return alloc


def stratified_sample(rows: Sequence[TraceRow], n: int, seed: int) -> list[int]:
    """Indices (ascending, so time order is kept) of n rows keeping the joint (input, output) distribution."""
    _check_n(rows, n)
    if n >= len(rows):
        return list(range(len(rows)))
    k = max(1, min(MAX_BINS, math.isqrt(max(1, n // 5))))  # ~5 rows per cell at least on average
    ins = _quantile_bins(np.array([r.input_len for r in rows]), k)
    outs = _quantile_bins(np.array([r.output_len for r in rows]), k)
    cell_of = ins * (k + 1) + outs
    cells, inverse, sizes = np.unique(cell_of, return_inverse=True, return_counts=True)
    alloc = _largest_remainder(sizes, n)
    rng = np.random.default_rng(seed)
    picked: list[int] = []
    for c in range(len(cells)):
        members = np.flatnonzero(inverse == c)
        picked.extend(rng.choice(members, size=alloc[c], replace=False).tolist())
    return sorted(picked)


def window_sample(rows: Sequence[TraceRow], n: int, seed: int) -> list[int]:
    """Indices of n consecutive rows starting at a seeded random row: the trace's own bursts and lulls."""
    _check_n(rows, n)
    if n >= len(rows):
        return list(range(len(rows)))
    start = int(np.random.default_rng(seed).integers(0, len(rows) - n + 1))
    return list(range(start, start + n))


def ks_distance(sample: Sequence[float], full: Sequence[float]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs.
    (scipy.stats.ks_2samp's statistic, computed here because importing scipy.stats costs ~1 s.)"""
    if len(sample) == 0 or len(full) == 0:
        raise ValueError("ks_distance needs two non-empty samples")
    a, b = np.sort(np.asarray(sample, dtype=float)), np.sort(np.asarray(full, dtype=float))
    at = np.concatenate([a, b])  # the ECDF gap peaks at one of the observed values
    gap = np.searchsorted(a, at, "right") / len(a) - np.searchsorted(b, at, "right") / len(b)
    return float(np.max(np.abs(gap)))


def fit_lengths(rows: Sequence[TraceRow], max_model_len: int,
                policy: str = "clip") -> tuple[list[TraceRow], int]:
    """Rows whose input + output fit max_model_len, and how many were changed.

    clip: shorten the input first (the output is what the replay measures token by token), then the
    output; scale: shrink both by the same factor, keeping their ratio. Either way each keeps at least
    1 token, and a row with a zero length is raised to 1 (an empty prompt or output cannot be replayed).
    """
    if policy not in LENGTH_POLICIES:
        raise ValueError(f"length policy {policy!r} is not one of {', '.join(LENGTH_POLICIES)}")
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2 (1 input + 1 output token), got {max_model_len}")
    out, changed = [], 0
    for r in rows:
        n_in, n_out = max(1, r.input_len), max(1, r.output_len)
        if n_in + n_out > max_model_len:
            if policy == "clip":
                n_in = max(1, max_model_len - n_out)
                n_out = min(n_out, max_model_len - n_in)
            else:
                f = max_model_len / (n_in + n_out)
                n_in, n_out = max(1, math.floor(n_in * f)), max(1, math.floor(n_out * f))
                n_in = min(n_in, max_model_len - n_out)  # floor of 1 on both can overshoot by one
        assert 1 <= n_in and 1 <= n_out and n_in + n_out <= max_model_len
        if (n_in, n_out) != (r.input_len, r.output_len):
            changed += 1
            r = replace(r, input_len=n_in, output_len=n_out)
        out.append(r)
    return out, changed


def changed_shares(before: Sequence[TraceRow], after: Sequence[TraceRow]) -> tuple[float, float]:
    """(share of input lengths, share of output lengths) that differ between before and after, row by row:
    what `fit_lengths` changed. Rows are matched by position; both lists must be as long and non-empty."""
    if len(before) != len(after) or not before:
        raise ValueError(f"changed_shares needs two non-empty lists of one length, got {len(before)} and "
                         f"{len(after)} rows")
    n = len(before)
    return (sum(a.input_len != b.input_len for a, b in zip(before, after)) / n,
            sum(a.output_len != b.output_len for a, b in zip(before, after)) / n)
