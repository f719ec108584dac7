"""What a sweep of A/Bs says as a whole (plain verdict dicts in, no I/O): how many passed, failed or were
inconclusive, and per gate the spread of its deltas and how often its interval contained zero.

For an A/A sweep (identical arms) that is the gates' calibration: every fail is a false alarm, and about
95% of the intervals should contain zero. Its latency gates' run pairs also measure the run-to-run noise
that `gate.run_noise` should assume on this machine; each A/A's interval is then recomputed with the noise
measured from the *other* A/As (leave one out), so the coverage reported for that prior is out of sample.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from optladder.abtest.run_pairs import run_noise_from_aa, t_interval
from optladder.abtest.verdict import on_bound


@dataclass
class GateSpread:
    gate: str
    statuses: dict[str, int]
    estimates: list[float]
    covers_zero: int  # intervals containing zero
    intervals: int
    # latency gates over run pairs
    log_ratios: list[float] = field(default_factory=list)
    by_opener: dict[str, list[float]] = field(default_factory=dict)  # first pair's log ratio by opening arm
    noise: tuple[float, int] | None = None  # measured run noise SD, from how many pairs
    loo_covers_zero: int = 0
    loo_intervals: int = 0
    loo_statuses: dict[str, int] = field(default_factory=dict)


@dataclass
class SweepSummary:
    verdicts: dict[str, int]
    gates: list[GateSpread]
    n: int


def summarize(verdicts: list[dict], alpha: float = 0.05, weight: float | None = None) -> SweepSummary:
    """`weight`: the run_noise_weight for the leave-one-out intervals (default: the other A/As' pairs)."""
    by_gate: dict[str, list[dict]] = {}
    for v in verdicts:
        for g in v["gates"]:
            by_gate.setdefault(f"{g['gate']}:{g['metric']}", []).append({**g, "_first": v.get("first")})
    return SweepSummary(dict(Counter(v["status"] for v in verdicts)),
                        [_spread(name, gs, alpha, weight) for name, gs in by_gate.items()], len(verdicts))


def _spread(name: str, gates: list[dict], alpha: float, weight: float | None) -> GateSpread:
    ivs = [g["interval"] for g in gates if g.get("interval")]
    out = GateSpread(name, dict(Counter(g["status"] for g in gates)),
                     [iv["estimate"] for iv in ivs if iv["estimate"] is not None],
                     sum(iv["low"] is not None and iv["low"] <= 0 <= iv["high"] for iv in ivs), len(ivs))
    paired = [(g, g["interval"]) for g in gates if g.get("interval") and g["interval"].get("pair_log_ratios")]
    if len(paired) < 2:
        return out
    for g, iv in paired:
        out.log_ratios += iv["pair_log_ratios"]
        out.by_opener.setdefault(g["_first"] or "?", []).append(iv["pair_log_ratios"][0])
    out.noise = run_noise_from_aa(out.log_ratios)
    for i, (g, iv) in enumerate(paired):
        others = [d for j, (_, other) in enumerate(paired) if j != i for d in other["pair_log_ratios"]]
        sd, pairs = run_noise_from_aa(others)
        loo = t_interval(np.array(iv["pair_log_ratios"]), iv["request_var"], sd,
                         pairs if weight is None else weight, alpha)
        out.loo_covers_zero += loo.low <= 0 <= loo.high
        out.loo_intervals += 1
        if g.get("bound") is not None:
            status = on_bound(loo.low, loo.high, g["bound"])
            out.loo_statuses[status] = out.loo_statuses.get(status, 0) + 1
    return out


def summary_markdown(s: SweepSummary, title: str = "A/B sweep") -> str:
    v = s.verdicts
    lines = [f"## {title}: {s.n} A/Bs", "",
             f"verdicts: pass {v.get('pass', 0)}, fail {v.get('fail', 0)}, inconclusive {v.get('inconclusive', 0)}",
             "",
             "| gate | pass | fail | inconclusive | delta min | median | max | SD | intervals containing 0 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g in s.gates:
        e = np.array(g.estimates) if g.estimates else np.array([np.nan])
        sd = e.std(ddof=1) if e.size > 1 else np.nan
        cover = f"{g.covers_zero}/{g.intervals}" if g.intervals else "-"
        st = g.statuses
        lines.append(f"| {g.gate} | {st.get('pass', 0)} | {st.get('fail', 0)} | {st.get('inconclusive', 0)} | "
                     f"{_f(e.min())} | {_f(np.median(e))} | {_f(e.max())} | {_f(sd)} | {cover} |")
    for g in s.gates:
        if g.noise is None:
            continue
        sd, pairs = g.noise
        lines += ["", f"**{g.gate}** over run pairs: the SD of log(candidate / control) over {pairs} A/A pairs is "
                      f"{sd:.4f}, the value for `gate.run_noise` (with `gate.run_noise_weight: {pairs}`).",
                  f"Recomputed with the noise measured from the other A/As (leave one out): {g.loo_covers_zero}/"
                  f"{g.loo_intervals} intervals contain 0; verdicts pass "
                  f"{g.loo_statuses.get('pass', 0)}, fail {g.loo_statuses.get('fail', 0)}, inconclusive "
                  f"{g.loo_statuses.get('inconclusive', 0)}."]
        for opener, ds in sorted(g.by_opener.items()):
            lines.append(f"- first pair opened by the {opener}: mean change {np.expm1(np.mean(ds)):+.2%} "
                         f"over {len(ds)}")
    return "\n".join(lines) + "\n"


def _f(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:+.2%}"
