"""The teacher-forced measures of a lossy candidate (optladder/quality/teacher_forced.py) as statistics with intervals,
and the gates that decide on them.

Each measure is a ratio over prompts (a sum over positions divided by a count), so a percentile bootstrap
resamples prompts, never positions: the positions of one answer are far from independent.
- quality/kl_vs_control_mean: mean per-position KL(control ‖ candidate), nats;
- quality/kl_vs_control_p99: its 99th percentile over positions (resampled prompts carry their positions);
- quality/top1_agree_vs_control: the fraction of positions whose most likely token is the control's;
- quality/ppl_ref_rel_change: the reference answers' perplexity, candidate / control − 1, paired by prompt.
A gate passes when the whole interval is on the good side of its bound, fails when the whole interval is on
the bad side, and is inconclusive otherwise. Plain numpy, no I/O.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from optladder.abtest.stats import Interval
from optladder.quality.teacher_forced import TeacherForcedScores

KL_MEAN = "quality/kl_vs_control_mean"
KL_P99 = "quality/kl_vs_control_p99"
TOP1 = "quality/top1_agree_vs_control"
PPL = "quality/ppl_ref_rel_change"
MEASURES = (KL_MEAN, KL_P99, TOP1, PPL)
_CHUNK = 100  # resamples at once: [100, positions] floats for the p99


class Check(NamedTuple):
    metric: str
    status: str  # pass | fail | inconclusive
    reason: str
    value: float | None
    interval: Interval | None


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def _ppl_change(tf: TeacherForcedScores, w: np.ndarray) -> np.ndarray:
    """w [B, P] prompt weights (resample counts) -> relative perplexity change per resample."""
    n = w @ tf.ref_tokens
    return np.exp(_ratio(w @ (tf.ref_nll_candidate - tf.ref_nll_control), n)) - 1.0


def _p99(tf: TeacherForcedScores, w: np.ndarray) -> np.ndarray:
    """Weighted 0.99 quantile of the positions' KL, each position weighted by its prompt's count."""
    order = np.argsort(tf.token_kl, kind="stable")
    kl, prompt = tf.token_kl[order], tf.token_prompt[order]
    out = []
    for start in range(0, w.shape[0], _CHUNK):
        cum = np.cumsum(w[start:start + _CHUNK][:, prompt], axis=1)
        idx = (cum >= 0.99 * cum[:, -1:]).argmax(axis=1)
        out.append(kl[idx])
    return np.concatenate(out)


def measures(tf: TeacherForcedScores, w: np.ndarray) -> dict[str, np.ndarray]:
    """Every measure under prompt weights w [B, P]; a row of ones is the point estimate."""
    return {KL_MEAN: _ratio(w @ tf.kl_sum, w @ tf.positions), KL_P99: _p99(tf, w),
            TOP1: _ratio(w @ tf.top1_agree, w @ tf.positions), PPL: _ppl_change(tf, w)}


def intervals(tf: TeacherForcedScores, n_boot: int = 2000, seed: int = 0,
              alpha: float = 0.05) -> dict[str, Interval]:
    """Percentile-bootstrap interval of each measure over prompts (prompts without a scored position count
    as prompts with no weight: they cannot move a ratio)."""
    p = tf.num_prompts
    point = measures(tf, np.ones((1, p)))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, p, size=(n_boot, p))
    w = np.zeros((n_boot, p))
    np.add.at(w, (np.arange(n_boot)[:, None], idx), 1.0)
    boot = measures(tf, w)
    out = {}
    for name, values in boot.items():
        finite = values[np.isfinite(values)]
        if finite.size == 0 or not np.isfinite(point[name][0]):
            continue
        low, high = np.quantile(finite, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
        out[name] = Interval(float(point[name][0]), float(low), float(high), p)
    return out


def _fmt(x: float, metric: str) -> str:
    return f"{x:+.3%}" if metric == PPL else (f"{x:.2%}" if metric == TOP1 else f"{x:.4g}")


def check(metric: str, bound: float, iv: Interval | None, tf: TeacherForcedScores, alpha: float,
          min_prompts: int) -> Check:
    """`bound` is a ceiling (KL, perplexity change) or, for top-1 agreement, a floor."""
    if tf.unavailable:
        return Check(metric, "inconclusive", f"{metric} not measured: {tf.unavailable}", None, None)
    if iv is None:
        return Check(metric, "inconclusive", f"{metric}: no scored position in either arm", None, None)
    scored = int((tf.positions > 0).sum())
    head = (f"{metric}: {_fmt(iv.estimate, metric)} [{round((1 - alpha) * 100, 2):g}% CI {_fmt(iv.low, metric)}, "
            f"{_fmt(iv.high, metric)}; {scored} prompts, {int(tf.positions.sum())} positions]")
    if tf.approximated:
        head += f" (approximated: {tf.approximated})"
    if scored < min_prompts:
        return Check(metric, "inconclusive", f"{head}; fewer than gate.min_pairs={min_prompts} prompts scored",
                     iv.estimate, iv)
    floor = metric == TOP1
    if floor:
        status = "pass" if iv.low >= bound else ("fail" if iv.high < bound else "inconclusive")
        limit = f"required at least {_fmt(bound, metric)}"
    else:
        status = "pass" if iv.high <= bound else ("fail" if iv.low > bound else "inconclusive")
        limit = f"allowed at most {_fmt(bound, metric)}"
    return Check(metric, status, f"{head}; {limit} -> {status}", iv.estimate, iv)


def teacher_forced_checks(tf: TeacherForcedScores | None, bounds: dict[str, float], n_boot: int, seed: int,
                          alpha: float, min_prompts: int) -> list[Check]:
    """One check per configured bound (metric -> ceiling, or floor for top-1 agreement)."""
    if tf is None:
        tf = TeacherForcedScores.not_measured("no teacher-forced scores for this candidate (only lossy "
                                              "candidates of an A/B or ladder are scored)")
    ivs = {} if tf.unavailable else intervals(tf, n_boot, seed, alpha)
    return [check(m, b, ivs.get(m), tf, alpha, min_prompts) for m, b in bounds.items()]
