"""Does a ladder reproduce? Two runs of the same ladder side by side: the same settings, the same verdict at every
rung, and each headline metric within run-to-run noise.

    python -m optladder.experiments.ladder_compare LADDER_A LADDER_B [--noise-sd 0.10] [--k 2] [--k-max 4] [--per-metric]
        [--verdicts strict|consistent] [--noise-from LADDER_C LADDER_D] [--ignore KEY ...]

LADDER_A / LADDER_B: a ladder's run directory (the one holding ladder.json and its rung directories) or its
ladder.json. A metric is within noise when |ln(B / A)| <= k * noise_sd: noise_sd is the SD of the log ratio of
two identical runs (gate.run_noise, measured by an A/A sweep: benchmarks/results/aa_cpu/README.md; 0.10 for E2E p99), k = 2
about 95% of identical pairs. So two identical runs leave some of a ladder's ~60 metrics outside by chance (at k = 2
each has a 4.6% chance: at least one of 60 in 94% of identical pairs); the metrics together are within noise when
no more are outside than the 95th percentile of that chance count (a sum of each metric's chance, over the metrics
that moved by 1% or more: a figure that barely moves, peak memory, a deterministic score, would only raise the
allowance) and none is as improbable as --k-max SDs (4) of a normal. The count treats the metrics as independent:
those of a rung move together, and a measured SD is shared by a metric's rungs, so the outside ones cluster and the
allowance is on the generous side. --per-metric counts every metric outside k SDs instead. Settings are the
rungs' resolved configs (the first rung's, when both directories hold their snapshots): a ladder run with other settings is not a reproduction, whatever its numbers. Machines and
code that differ are listed, not judged (a reproduction on another machine is the point). Each rung's load (the
trace's offered output tokens per second times the measured time per decode row; see `load`) is shown: a rung at
0.8 or more ran at or near its capacity, where latency follows the path its queue took, and is marked where named.

--noise-from C D measures the noise instead of assuming it: two earlier runs of one ladder (the same rungs and
settings, refused otherwise; another pair than A and B, or the measurement would judge itself), and for each headline
metric the root mean square of ln(D / C) over the rungs both have it (for identical ladders the true ratio is 1, so
that is the SD of the log ratio of two runs, with as many degrees of freedom as rungs; a systematic shift between C
and D, another machine's, is in it too: its mean is printed). It is used where measured over at least 5 rungs, never
below --noise-sd (7 rungs measure a small SD poorly), and a metric's chance of landing outside k SDs is then
Student's t with those degrees of freedom, not the normal's: P(|t| > k * SD used / SD measured), so a metric whose
measured SD is below --noise-sd is given its small chance, not the floor's. With few rungs "as improbable as 4 SDs
of a normal" is many measured SDs (~8.5 at 7 rungs).

A verdict that differs is classified from its gates' own intervals: "borderline" when no gate passed in one run and
failed in the other and, at every deciding gate whose status differs, the two runs' estimates differ by less than
their intervals' combined half-width (sqrt(hw_A^2 + hw_B^2), in log ratio for latency gates; the intervals at the
gates' own level, gate.alpha, 95% by default): the same effect measured twice, landing on either side of a gate's
bound; "contradiction" when a gate passed in one and failed in the other; "disagreement" when the estimates differ
by more, or a deciding gate ran in one run only. With one run pair per rung a latency interval is
wide (gate.run_noise with its weight as df), so an effect a few tens of percent below a bound is borderline: its
verdict can be pass in one run and inconclusive in the next. --verdicts strict (the default) counts every
different verdict; consistent counts contradictions and disagreements only, and lists the borderline ones. The
rungs each ladder kept are compared either way.

--figures changes (the default where both ladders ran with ladder.interleave, each rung beside a run of its
control): a rung's timed figures (TTFT p50, TPOT p50, E2E p99, throughput) are compared as its change against the
control run beside it, ln((B / B's control) / (A / A's control)), within k SDs of that difference, sqrt(2) x
--noise-sd (each change is one run pair's log ratio, whose SD gate.run_noise is) or measured (--noise-from an earlier
interleaved pair: the RMS of the changes' log ratio). The ladder claims changes; an absolute timed figure is the
machine's speed as well (an eager GPU step: the host's speed at launching kernels, which moved 1.5x between rungs a
minute apart on one H200), so the baseline's timed figures, and those of a rung without a run beside it, are shown
and not judged. Memory, KV and quality figures are compared as they are. --figures absolute compares every figure as
it is (the rule for ladders without interleave).

--noise-within (interleaved ladders): the noise is measured inside A and B themselves: each control run beside a
rung is the same config as that control's own run, minutes apart, so every rung after the baseline gives an A/A
pair (optladder/abtest/ladder.py's noise_beside); a timed figure's SD of one pair's log ratio is the RMS over both ladders'
pairs (12 for a ladder of seven rungs), and a change of B against A's differs with sqrt(2) times that (Student's t
with as many df as pairs; never below sqrt(2) x --noise-sd). The runs beside measure peak memory, KV reserved and KV
utilization too, compared as they are: B's against A's differ with the pairs' RMS itself (never below --noise-sd).
Quality is not measured beside (those runs score no answers): its band stays --noise-sd.
Where both ran interleaved, each rung's decode step per row (stage/decode_ms_mean over perf/step_decode_tokens_mean)
and its decode steps are printed beside its control's, in A and in B (reported, not judged): the engine's own speed
apart from its queue's path, and, in other step counts, a batch path that moved.

A ladder cut short (a deadline, a crash, a lost machine) leaves ladder.json with `complete: false` and the rungs it
reached: the two are compared on the rungs both reached, and the rungs not reached count as not reproduced, unless
--partial (then the comparison judges those rungs only, and says so). --noise-within still measures the noise on every
A/A pair both ladders hold, those beside rungs not compared too (the same configs minutes apart: noise all the same).

Exit status: 0 reproduced, 1 not (each reason printed), 2 the input cannot be compared (missing files, other rungs).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from optladder.abtest.ladder import BESIDE, LOADED, ROWS, _fmt, load, noise_beside, row_ms
from optladder.experiments.diff import diff_dicts
from optladder.experiments.snapshot import SNAPSHOT_FILE

LADDER_FILE = "ladder.json"
# where files live, not what ran (the digests below say whether the data is the same)
NOT_SETTINGS = ("data.root", "tracking.uri", "hydra.")


class CompareError(ValueError):
    """The two ladders cannot be compared (say why)."""


def load_ladder(ref: str) -> tuple[dict, Path | None]:
    """(ladder.json's content, the run directory or None when given the file alone)."""
    path = Path(ref)
    file = path / LADDER_FILE if path.is_dir() else path
    if not file.is_file():
        raise CompareError(f"{ref}: no {LADDER_FILE} there (give a ladder's run directory or its {LADDER_FILE})")
    ladder = json.loads(file.read_text())
    if not isinstance(ladder, dict) or not isinstance(ladder.get("rungs"), list) or not ladder["rungs"]:
        raise CompareError(f"{file}: not a ladder's {LADDER_FILE} (no rungs)")
    return ladder, file.parent if path.is_dir() else None


def _snapshot(run_dir: Path | None, rung: dict) -> dict | None:
    """The rung's config snapshot: its first run directory (rung<i>-<opt>-r0), not a rerun of its control."""
    if run_dir is None:
        return None
    name = rung["opt"] or "baseline"
    snap = run_dir / f"rung{rung['rung']}-{name}-r0" / SNAPSHOT_FILE
    return json.loads(snap.read_text()) if snap.is_file() else None


def within(a: float | None, b: float | None, band: float) -> bool | None:
    """B within band (in log ratio) of A; None when it cannot be said (a value missing, or signs differ)."""
    if a is None or b is None:
        return None
    if a == b:
        return True
    if a <= 0 or b <= 0:
        return None
    return abs(math.log(b / a)) <= band


def _interval(gate: dict) -> tuple[float, float] | None:
    """(estimate, half-width) of a gate's interval (at the gate's level); in log ratio for a latency gate (its
    interval is a relative change). None when the gate has no interval."""
    iv = gate.get("interval") or {}
    est, low, high = iv.get("estimate"), iv.get("low"), iv.get("high")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (est, low, high)):
        return None
    if _latency(gate):
        if min(est, low, high) <= -1:
            return None
        est, low, high = math.log1p(est), math.log1p(low), math.log1p(high)
    return est, (high - low) / 2


def _latency(gate: dict) -> bool:
    """A latency gate: its interval is a relative change, compared in log ratio."""
    return str(gate.get("gate", "")).startswith("latency")


def verdict_difference(x: dict, y: dict) -> tuple[str, list[str]]:
    """How two runs' differing verdicts of a rung differ: ("borderline" | "contradiction" | "disagreement", the
    gates' lines)."""
    ga = {(g.get("gate"), g.get("metric")): g for g in (x.get("verdict") or {}).get("gates", [])}
    gb = {(g.get("gate"), g.get("metric")): g for g in (y.get("verdict") or {}).get("gates", [])}
    kind, lines = "borderline", []
    if {x["status"], y["status"]} == {"pass", "fail"}:
        kind = "contradiction"

    def disagree() -> None:  # a contradiction stays one
        nonlocal kind
        kind = "disagreement" if kind == "borderline" else kind
    for key in sorted(ga.keys() ^ gb.keys(), key=str):  # a deciding gate only one run has: not the same judgement
        one = ga.get(key) or gb.get(key)
        if one.get("decides", True):
            disagree()
            lines.append(f"{key[0]}:{key[1]}: only in {'A' if key in ga else 'B'} ({one.get('status')})")
    for key in sorted(ga.keys() & gb.keys(), key=str):
        a, b = ga[key], gb[key]
        if a.get("status") == b.get("status") or not (a.get("decides", True) or b.get("decides", True)):
            continue
        name = f"{key[0]}:{key[1]}"
        if {a.get("status"), b.get("status")} == {"pass", "fail"}:
            kind = "contradiction"
            lines.append(f"{name}: {a.get('status')} in A, {b.get('status')} in B")
            continue
        ia, ib = _interval(a), _interval(b)
        if ia is None or ib is None:  # a gate without an interval (an exact-match count) changed its mind
            disagree()
            lines.append(f"{name}: {a.get('status')} in A, {b.get('status')} in B (no interval to weigh)")
            continue
        gap, allowed = abs(ia[0] - ib[0]), math.hypot(ia[1], ib[1])
        if gap > allowed:
            disagree()
        unit = " in log ratio" if _latency(a) else ""
        lines.append(f"{name}: {a.get('status')} in A ({_iv(a)}), {b.get('status')} in B ({_iv(b)}): the estimates "
                     f"differ by {gap:.3f}{unit}, {'within' if gap <= allowed else 'beyond'} their intervals' "
                     f"combined half-width {allowed:.3f}")
    if not lines:  # the verdicts differ, but no gate both ran says why
        disagree()
        lines.append("no deciding gate's status differs in both runs' verdicts (a gate only one of them ran?)")
    return kind, lines


def _iv(gate: dict) -> str:
    iv = gate.get("interval") or {}
    f = (lambda v: f"{v:+.1%}") if _latency(gate) else (lambda v: f"{v:.4g}")  # noqa: E731
    return f"{f(iv['estimate'])} [{f(iv['low'])}, {f(iv['high'])}]"


def _ignored(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p if p.endswith(".") else p + ".") for p in prefixes)


VERDICT_MODES = ("strict", "consistent")


MIN_NOISE_RUNGS = 5  # a metric's noise measured over fewer rungs is not used
MOVED = 0.01  # a metric that moved less than this (in log ratio) does not count towards the chance allowance
FIGURES = ("auto", "changes", "absolute")
# what a rung's control run beside it (ladder.interleave) measures as well: compared as changes against it
TIMED = tuple(key for _, key in BESIDE)
# what it measures that is compared as it is: how much KV a replay reserves follows which requests overlapped, so
# identical runs differ (KV reserved moved 0.69-1.36x between identical runs on the H200 at time scale 4)
AS_MEASURED = ("perf/peak_mem_gb", "perf/kv_reserved_gb", "perf/kv_util")


def step_costs(rungs: list[dict]) -> list[tuple[str, str]]:
    """(rung, what its decode steps did against its control run beside it): ms per decode row, control -> rung
    (change), and the decode steps each took (a batch path that moved shows as other step counts). Rungs without
    a run beside them or without the step timers are left out."""
    out = []
    for r in rungs[1:]:
        own, beside = r.get("metrics", {}), (r.get("control_beside") or {}).get("metrics", {})
        cost, control = row_ms(own), row_ms(beside)
        if cost is None or control is None:
            continue
        steps = [m.get("perf/steps") for m in (beside, own)]
        text = f"{control:.1f} -> {cost:.1f} ms ({cost / control - 1:+.0%})"
        if all(isinstance(v, (int, float)) for v in steps):
            text += f", {steps[0]:,.0f} -> {steps[1]:,.0f} steps"
        out.append((f"rung {r['rung']} ({r['opt'] or 'baseline'})", text))
    return out


def interleaved(ladder: dict) -> bool:
    """Whether every rung after the baseline that ran (no error) ran beside a run of its control."""
    ran = [r for r in ladder["rungs"][1:] if r.get("status") != "error"]
    return bool(ran) and all(r.get("control_beside") for r in ran)


def noise_within(*ladders: dict) -> dict[str, tuple[float, int, float]]:
    """--noise-within: a figure the runs beside the rungs measure -> (its SD between the ladders, pairs, their mean
    log ratio), from the RMS of the A/A pairs' log ratios pooled over the ladders. A timed figure is compared as a
    change (one pair's log ratio), so two ladders' changes differ with sqrt(2) x that RMS; memory and KV
    (AS_MEASURED) are compared as they are, one run against one run, which differ with the RMS itself (an A/A pair
    is one run against one run). A figure that was the same in every pair, or measured on fewer than
    MIN_NOISE_RUNGS pairs, gets no entry: its band stays --noise-sd. The pairs are minutes apart on one machine:
    what differs between two sessions' machines beyond that is not in them."""
    logs: dict[str, list[tuple[float, int, float]]] = {}
    for ladder in ladders:
        for key, got in noise_beside(ladder["rungs"], TIMED + AS_MEASURED).items():
            logs.setdefault(key, []).append(got)
    out = {}
    for key, parts in logs.items():
        n = sum(m for _, m, _ in parts)
        rms = math.sqrt(sum(sd * sd * m for sd, m, _ in parts) / n)
        if rms > 0 and n >= MIN_NOISE_RUNGS:
            out[key] = ((math.sqrt(2) if key in TIMED else 1.0) * rms, n, sum(mean * m for _, m, mean in parts) / n)
    return out


def figure(row: dict, key: str, changes: bool) -> tuple[float | None, str]:
    """(value, kind) of a rung's figure: kind "change" (the rung over its control run beside it; None where either
    lacks the figure), "reported" (a timed figure of a rung without such a run, the baseline's, under changes:
    shown, not judged) or "absolute"."""
    value = row.get("metrics", {}).get(key)
    if not changes or key not in TIMED:
        return value, "absolute"
    if not row.get("control_beside"):
        return value, "reported"
    ctl = row["control_beside"].get("metrics", {}).get(key)
    if isinstance(value, (int, float)) and isinstance(ctl, (int, float)) and value > 0 and ctl > 0:
        return value / ctl, "change"
    return None, "change"  # not measured in one of the two: "-" where neither ladder has it, "(?)" otherwise


def measured_noise(c: tuple[dict, Path | None], d: tuple[dict, Path | None], changes: bool = False
                   ) -> dict[str, tuple[float, int, float]]:
    """Headline metric -> (SD of the log ratio of two runs, rungs it was measured over, mean log ratio), from two runs
    C and D of one ladder: the root mean square of ln(D / C) over the rungs that have the metric positive in both. A
    metric that was the same at every rung gets no entry (a quality score of a deterministic engine: the band stays
    --noise-sd, not zero); nor does one measured over fewer than MIN_NOISE_RUNGS rungs. changes: a timed figure is
    each rung's change against its control run beside it (figure()), over the rungs that have one in both."""
    rc, rd = c[0]["rungs"], d[0]["rungs"]
    if [r["opt"] for r in rc] != [r["opt"] for r in rd]:
        raise CompareError(f"--noise-from: the two ladders have other rungs: {[r['opt'] for r in rc]}, "
                           f"{[r['opt'] for r in rd]}")
    out: dict[str, tuple[float, int, float]] = {}
    for _, key in ROWS:
        logs = []
        for x, y in zip(rc, rd):
            (vx, kx), (vy, ky) = figure(x, key, changes), figure(y, key, changes)
            if kx != "reported" and kx == ky and all(isinstance(v, (int, float)) and v > 0 for v in (vx, vy)):
                logs.append(math.log(vy / vx))
        if len(logs) >= MIN_NOISE_RUNGS and any(v != 0 for v in logs):
            out[key] = (math.sqrt(sum(v * v for v in logs) / len(logs)), len(logs), sum(logs) / len(logs))
    return out


def settings_differences(a: tuple[dict, Path | None], b: tuple[dict, Path | None], ignore: tuple[str, ...] = ()
                         ) -> tuple[list[tuple], list[tuple], list[str]] | None:
    """(counted differences of the resolved configs, those not counted, the data digests that differ) between the
    first rungs' snapshots of two ladders; None when a snapshot is missing."""
    return _differences(_snapshot(a[1], a[0]["rungs"][0]), _snapshot(b[1], b[0]["rungs"][0]), ignore)


def _differences(sa: dict | None, sb: dict | None, ignore: tuple[str, ...]
                 ) -> tuple[list[tuple], list[tuple], list[str]] | None:
    """settings_differences of two snapshots already read."""
    if sa is None or sb is None:
        return None
    every = diff_dicts(sa.get("resolved_config", {}), sb.get("resolved_config", {}))
    settings = [d for d in every if not _ignored(d[0], NOT_SETTINGS + tuple(ignore))]
    digests = [digest for digest in ("requests_digest", "prompts_digest") if sa.get(digest) != sb.get(digest)]
    return settings, [d for d in every if d not in settings], digests


def chance_outside(p: list[float], level: float = 0.95) -> int:
    """The smallest m with P(at most m of the metrics outside) >= level, each metric i outside with chance p[i]
    independently (a Poisson-binomial distribution, by dynamic programming)."""
    dist = [1.0]
    for q in p:
        dist = [(dist[j] if j < len(dist) else 0.0) * (1 - q) + (dist[j - 1] * q if j else 0.0)
                for j in range(len(dist) + 1)]
    cdf = 0.0
    for m, v in enumerate(dist):
        cdf += v
        if cdf >= level - 1e-12:
            return m
    return len(p)


def tail(z: float, df: int) -> float:
    """P(|X| > z): X standard normal (df 0: the SD assumed) or Student's t with df degrees of freedom (measured)."""
    if df <= 0:
        return math.erfc(z / math.sqrt(2))
    from scipy.stats import t
    return float(2 * t.sf(z, df))


def compare(a: tuple[dict, Path | None], b: tuple[dict, Path | None], noise_sd: float = 0.10,
            k: float = 2.0, ignore: tuple[str, ...] = (), verdicts: str = "strict",
            noise: dict[str, tuple[float, int, float]] | None = None, k_max: float = 4.0,
            per_metric: bool = False, figures: str = "auto",
            noise_how: str = "--noise-from; RMS of ln(D / C) over n rungs",
            partial: bool = False) -> tuple[bool, list[str]]:
    """(reproduced, the report's lines). ignore: settings (keys or prefixes) whose difference does not count,
    e.g. a default that changed between the runs for a switch neither ran. verdicts: strict, every verdict that
    differs counts; consistent, only contradictions and disagreements do (see the module's doc). noise: a metric's
    measured SD of the log ratio (measured_noise), in place of noise_sd for that metric, never below it. k_max: a
    metric as improbable as k_max SDs of a normal counts whatever the others do; per_metric: every metric outside k
    SDs counts, not only more than chance leaves outside. figures: auto, changes or absolute (the module's doc;
    auto: changes where both ladders ran interleaved); with changes, noise must be measured on changes too.
    A ladder cut short (ladder.json complete: false) is compared on the rungs both reached; the rest not compared
    counts as not reproduced unless partial."""
    if verdicts not in VERDICT_MODES:
        raise CompareError(f"verdicts={verdicts!r}: one of {', '.join(VERDICT_MODES)}")
    if figures not in FIGURES:
        raise CompareError(f"figures={figures!r}: one of {', '.join(FIGURES)}")
    (la, da), (lb, db) = a, b
    ra, rb = la["rungs"], lb["rungs"]
    cut_note: str | None = None
    left: list[str] = []  # the planned rungs a ladder cut short did not reach
    cut = [name for name, x in (("A", la), ("B", lb)) if x.get("complete") is False]
    if cut:  # a ladder cut short (ladder.json is written after every rung): the rungs both reached
        plan_a, plan_b = (x.get("planned") or [r["opt"] for r in x["rungs"][1:]] for x in (la, lb))
        if plan_a != plan_b:
            raise CompareError(f"the ladders planned other rungs: A {plan_a}, B {plan_b}")
        n = min(len(ra), len(rb))
        if n < 2:
            raise CompareError(f"{' and '.join(n_ for n_, x in (('A', la), ('B', lb)) if len(x['rungs']) < 2)} cut "
                               "short before its first rung: nothing to compare but the baselines")
        ra, rb = ra[:n], rb[:n]
        left = plan_a[n - 1:]
        cut_note = (f"{' and '.join(cut)} cut short (ladder.json complete: false): rungs 0-{n - 1} compared, "
                    f"{len(left)} not ({', '.join(left)})" if left else
                    f"{' and '.join(cut)} not marked complete, all {n - 1} planned rungs there: compared")
    opts_a, opts_b = [r["opt"] for r in ra], [r["opt"] for r in rb]
    if opts_a != opts_b:
        raise CompareError(f"the ladders have other rungs: A {opts_a}, B {opts_b}")
    both = interleaved(la) and interleaved(lb)
    if figures == "changes" and not both:
        raise CompareError("--figures changes: " + " and ".join(n for n, x in (("A", la), ("B", lb))
                                                                 if not interleaved(x))
                           + " ran without ladder.interleave (a rung without a run of its control beside it)")
    changes = figures == "changes" or (figures == "auto" and both)
    noise = noise or {}
    # a change is one run pair's log ratio (SD noise_sd): two of them differ with SD sqrt(2) x noise_sd
    floor = {key: noise_sd * (math.sqrt(2) if changes and key in TIMED else 1) for _, key in ROWS}
    sd = {key: max(floor[key], noise[key][0]) if key in noise else floor[key] for _, key in ROWS}
    # degrees of freedom of a measured SD; 0 (a normal's tails) where assumed, or measured below the floor and raised
    df = {key: noise[key][1] if key in noise and noise[key][0] >= floor[key] else 0 for _, key in ROWS}
    # a metric's chance of landing outside k SDs between identical runs: Student's t over its measured SD where
    # measured (small where the floor raised it), else the normal's
    p_chance = {key: tail(k * sd[key] / noise[key][0], noise[key][1]) if key in noise else tail(k, 0)
                for _, key in ROWS}
    p_gross = math.erfc(k_max / math.sqrt(2))  # as improbable as k_max SDs of a normal
    outside: list[str] = []  # metrics outside k SDs, each named with its rung (counted below if more than chance)
    chances: list[float] = []  # each metric that moved by MOVED or more: its chance of landing outside k SDs
    reasons: list[str] = []
    out: list[str] = []
    if cut_note:
        out.append(cut_note + (" (the rungs not compared count as not reproduced: --partial judges the rungs "
                               "compared only)" if left and not partial else ""))
        if left and not partial:
            reasons.append(f"{' and '.join(cut)} cut short: {', '.join(left)} not compared")

    sa, sb = _snapshot(da, ra[0]), _snapshot(db, rb[0])
    found = _differences(sa, sb, ignore)
    if found is None:
        out.append("settings: not compared (a rung directory's snapshot is missing: give both run directories)")
    else:
        settings, skipped, digests = found
        out.append(f"settings: {len(settings)} difference(s)" + (":" if settings else " (the same ladder)"))
        out += [f"  {key}: {va} -> {vb}" for key, va, vb in settings]
        if skipped:
            out.append("  not counted: " + "; ".join(f"{key}: {va} -> {vb}" for key, va, vb in skipped))
        if settings:
            reasons.append(f"the settings differ ({', '.join(key for key, _, _ in settings[:6])}"
                           f"{', ...' if len(settings) > 6 else ''}): not the same ladder")
        what = {"requests_digest": "requests", "prompts_digest": "quality prompts"}
        for digest in digests:
            out.append(f"  {digest}: {sa.get(digest)} -> {sb.get(digest)}")
            reasons.append(f"other {what[digest]} ({digest} differs)")
        env = [key for key, _, _ in diff_dicts(sa.get("environment", {}), sb.get("environment", {}))]
        out.append(f"environment (reported, not judged): {', '.join(env) if env else 'the same'}")
    out.append("")

    labels = [label for label, _ in ROWS]
    out.append("| rung | opt | verdict A | verdict B | load A / B | " + " | ".join(labels) + " |")
    out.append("|---|---|---|---|---|" + "---|" * len(labels))
    checked = missed = 0
    loaded: list[str] = []
    differing: list[tuple[str, str, list[str]]] = []  # (rung, kind, the gates' lines)
    for x, y in zip(ra, rb):
        opt = x["opt"] or "baseline"
        load_a, load_b = load(x.get("metrics", {})), load(y.get("metrics", {}))
        loads = " / ".join("-" if v is None else f"{v:.2f}" for v in (load_a, load_b))
        over = any(v is not None and v >= LOADED for v in (load_a, load_b))
        if over:
            loaded.append(f"rung {x['rung']} ({opt})")
        n_reasons = len(reasons)
        if x["status"] != y["status"]:
            kind, gate_lines = verdict_difference(x, y)
            differing.append((f"rung {x['rung']} ({opt}): {x['status']} in A, {y['status']} in B", kind, gate_lines))
            if verdicts == "strict" or kind != "borderline":
                reasons.append(f"rung {x['rung']} ({opt}): verdict {x['status']} in A, {y['status']} in B ({kind})")
        if x.get("kept") != y.get("kept"):
            reasons.append(f"rung {x['rung']} ({opt}): kept {x.get('kept')} in A, {y.get('kept')} in B")
        cells = []
        for label, key in ROWS:
            (va, kind_a), (vb, kind_b) = figure(x, key, changes), figure(y, key, changes)
            band = k * sd[key]
            if va is None and vb is None:
                cells.append("-")
                continue
            if "reported" in (kind_a, kind_b):  # a timed figure without a run beside it: the machine's speed too
                va, vb = x.get("metrics", {}).get(key), y.get("metrics", {}).get(key)  # both as measured
                cells.append(f"{_fmt(va)} -> {_fmt(vb)} (shown)")
                continue
            if kind_a == "change":
                label = f"{label.split(' (')[0]} vs its control beside it"  # a ratio: no unit
            ok = within(va, vb, band)
            if ok is None:
                cells.append(f"{_fmt(va)} -> {_fmt(vb)} (?)")
                continue
            checked += 1
            if va and (abs(math.log(vb / va)) >= MOVED or not ok):
                chances.append(p_chance[key])
            ratio = f"{vb / va:.2f}×" if va else "="
            cells.append(f"{ratio}" if ok else f"**{ratio}**")
            if not ok:
                missed += 1
                sds_out = abs(math.log(vb / va)) / sd[key]
                text = (f"rung {x['rung']} ({opt}): {label} {_fmt(va)} -> {_fmt(vb)} ({vb / va:.2f}×), outside "
                        f"±{band:.2f} in log ratio ({sds_out:.1f} SDs" + (f", t with {df[key]} df" if df[key] else "")
                        + ")")
                if tail(sds_out, df[key]) < p_gross:  # named with the rung's load below, as its other reasons
                    reasons.append(text + f": as improbable as {k_max:g} SDs or more")
                else:
                    outside.append(text + (f" [load {loads}]" if over else ""))
        if over:  # a moved figure or verdict of a rung past its capacity: say so where it is named
            reasons[n_reasons:] = [f"{r} [load {loads}]" for r in reasons[n_reasons:]]
        same = "" if x["status"] == y["status"] else " **≠**"
        out.append(f"| {x['rung']} | {opt} | {x['status']} | {y['status']}{same} | {loads} | "
                   + " | ".join(cells) + " |")
    # how many of the metrics that moved identical runs leave outside k SDs by chance, at most, 95 times in 100
    allowed = 0 if per_metric else chance_outside(chances)
    moved = f"{len(chances)} that moved by {MOVED:.0%} or more (or lie outside)"
    chance = []
    if len(outside) > allowed:
        reasons += outside
        if not per_metric:
            reasons.append(f"{len(outside)} metrics outside {k:g} SDs (none as improbable as {k_max:g} SDs of a "
                           f"normal): more than identical runs leave outside by chance (up to {allowed} of the "
                           f"{moved}, 95 times in 100)")
    elif outside:
        chance = [f"{len(outside)} metric(s) outside {k:g} SDs (none as improbable as {k_max:g} SDs of a normal), "
                  f"no more than identical runs leave outside by chance (up to {allowed} of the {moved}, 95 times "
                  "in 100): listed, not counted"] + [f"  {t}" for t in outside]
    same_verdicts = sum(x["status"] == y["status"] for x, y in zip(ra, rb))
    sds = f"{k:g} × {noise_sd:g}" if not noise else f"{k:g} × the measured noise (below; at least {noise_sd:g})"
    if changes:
        sds += (f" (× √2 for a change: {', '.join(label for label, key in ROWS if key in TIMED)} of each rung after "
                "the baseline are its change against its control run beside it, B's over A's shown; the baseline's "
                "are shown, not judged)")
    out += ["", f"verdicts: {same_verdicts}/{len(ra)} the same; metrics: {checked - missed}/{checked} within "
            f"{sds} in log ratio (B / A shown; bold: outside)"]
    if noise:
        out.append(f"noise measured ({noise_how}{'' if 'mean' in noise_how else ', its mean'}; used at least {noise_sd:g}"
                   + (f", for a change √2 × {noise_sd:g}" if changes else "") + "): "
                   + "; ".join(f"{label} {noise[key][0]:.3f} (n={noise[key][1]}, mean {noise[key][2]:+.3f})"
                               for label, key in ROWS if key in noise))
    out.append("load: the trace's offered out tok/s times the ms a decode-only step took per decode row, over 1000 "
               f"(an estimate: {LOADED:g} or more is at or near capacity)")
    if both:  # reported, not judged: the engine's speed per row, apart from the queue's path
        costs_a, costs_b = dict(step_costs(ra)), dict(step_costs(rb))
        names = [name for name in costs_a if name in costs_b]
        if names:
            out.append("decode step per row (reported, not judged): ms per decode row of each rung's control run "
                       "beside it -> the rung, and the decode steps each took (other counts: its batches formed "
                       "otherwise):")
            out += [f"  {name}: A {costs_a[name]}; B {costs_b[name]}" for name in names]
    kept = sum(x.get("kept") == y.get("kept") for x, y in zip(ra, rb))
    out.append(f"rungs kept (the ladder's decisions): the same at {kept}/{len(ra)}")
    if differing:
        kinds = [kind for _, kind, _ in differing]
        out.append(f"verdicts that differ ({', '.join(f'{kinds.count(k_)} {k_}' for k_ in dict.fromkeys(kinds))}; "
                   f"--verdicts {verdicts}: " + ("each counts" if verdicts == "strict" else
                                                  "borderline ones do not count") + "):")
        for head, kind, gate_lines in differing:
            out.append(f"- {head}: {kind}")
            out += [f"    {line}" for line in gate_lines]
    reproduced = not reasons
    out += chance
    out.append("reproduced" if reproduced else "not reproduced:")
    out += [f"- {r}" for r in reasons]
    if loaded and not reproduced:
        out.append(f"{len(loaded)} rung(s) ran at a load of {LOADED:g} or more in A or B ({', '.join(loaded)}).")
        out.append("At or near capacity (unless a decode row costs less as the batch grows: then the load reads high) "
                   "latency follows the path")
        out.append("the queue took and can move between runs by more than gate.run_noise says. A larger "
                   "workload.time_scale lowers the load only")
        out.append("where a step's cost follows its rows: a static batch makes requests wait for the batch before "
                   "them at any rate, and a step")
        out.append("whose cost is mostly fixed (an eager step of a small model) costs about the same with fewer "
                   "rows (benchmarks/results/gpu_ladder_h200/smollm2.md).")
    return reproduced, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ladder_a", help="a ladder's run directory, or its ladder.json")
    p.add_argument("ladder_b")
    p.add_argument("--noise-sd", type=float, default=0.10,
                   help="SD of ln(B / A) between identical runs (gate.run_noise; default 0.10)")
    p.add_argument("--k", type=float, default=2.0, help="how many SDs a metric may move (default 2)")
    p.add_argument("--verdicts", choices=VERDICT_MODES, default="strict",
                   help="strict: every verdict that differs counts (default); consistent: only contradictions and "
                        "disagreements count, borderline differences are listed")
    p.add_argument("--k-max", type=float, default=4.0,
                   help="a metric as improbable as this many SDs of a normal counts whatever the others do "
                        "(default 4)")
    p.add_argument("--per-metric", action="store_true",
                   help="every metric outside --k SDs counts (default: only more than chance leaves outside)")
    p.add_argument("--noise-from", nargs=2, metavar=("LADDER_C", "LADDER_D"),
                   help="two earlier runs of one ladder (not A or B; the same settings, --ignore applying): each "
                        "metric's noise is measured there, the RMS of ln(D / C) over the rungs (at least 5), in place "
                        "of --noise-sd but never below it")
    p.add_argument("--figures", choices=FIGURES, default="auto",
                   help="changes: a rung's timed figures against its control run beside it (ladder.interleave); "
                        "absolute: as they are; auto (default): changes where both ladders ran interleaved")
    p.add_argument("--noise-within", action="store_true",
                   help="interleaved ladders: measure the noise of each figure the runs beside the rungs measure "
                        "(timed, memory, KV) on the A/A pairs inside A and B (each control's run beside a rung "
                        "against its own run), in place of --noise-sd but never below it")
    p.add_argument("--partial", action="store_true",
                   help="a ladder cut short (ladder.json complete: false): judge the rungs both reached (default: "
                        "they are compared, and the rungs not reached count as not reproduced)")
    p.add_argument("--ignore", action="append", default=[], metavar="KEY",
                   help="a setting (or a prefix: engine.piecewise) whose difference does not count; repeatable")
    args = p.parse_args(argv)
    for name in ("noise_sd", "k", "k_max"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            p.error(f"--{name.replace('_', '-')}={value}: must be a positive number")
    if args.k_max < args.k:
        p.error(f"--k-max={args.k_max}: must be at least --k={args.k}")
    noise_notes: list[str] = []
    try:
        a_ladder, b_ladder = load_ladder(args.ladder_a), load_ladder(args.ladder_b)
        noise, how = None, "--noise-from; RMS of ln(D / C) over n rungs"
        if args.noise_within:
            if args.noise_from:
                raise CompareError("--noise-within and --noise-from: give one way to measure the noise")
            if args.figures == "absolute" or not (interleaved(a_ladder[0]) and interleaved(b_ladder[0])):
                raise CompareError("--noise-within: needs both ladders interleaved (ladder.interleave=true) and "
                                   "their changes compared (not --figures absolute): "
                                   + (" and ".join(n for n, x in (("A", a_ladder), ("B", b_ladder))
                                                   if not interleaved(x[0])) + " ran without it"
                                      if not (interleaved(a_ladder[0]) and interleaved(b_ladder[0]))
                                      else "--figures absolute given"))
            noise = noise_within(a_ladder[0], b_ladder[0])
            how = ("--noise-within; over n A/A pairs of A and B (ln(run beside a rung / its control's own run)), the "
                   "RMS (× √2 for a change), and the pairs' mean log ratio")
        if args.noise_from:
            def where(x: str) -> Path:  # a run directory, given as itself or by its ladder.json
                path = Path(x).resolve()
                return path.parent if path.is_file() else path
            if {where(x) for x in args.noise_from} & {where(x) for x in (args.ladder_a, args.ladder_b)}:
                raise CompareError("--noise-from: give another pair than the one compared (it would judge itself)")
            if where(args.noise_from[0]) == where(args.noise_from[1]):
                raise CompareError("--noise-from: C and D are the same run (every log ratio 0: nothing measured)")
            c, d = (load_ladder(x) for x in args.noise_from)
            if any(x[0] == y[0] for x in (c, d) for y in (a_ladder, b_ladder)):
                raise CompareError("--noise-from: C or D holds the same ladder.json as A or B (a copy of it?)")
            found = settings_differences(c, d, tuple(args.ignore))
            if found is None:
                raise CompareError("--noise-from: a rung directory's snapshot is missing in C or D (give both run "
                                   "directories: their settings must be the same ladder's)")
            if found[0] or found[2]:
                raise CompareError("--noise-from: C and D are not runs of one ladder (" + ", ".join(
                    [key for key, _, _ in found[0][:6]] + found[2]) + " differ), so their ratios are effects, "
                    "not noise (--ignore KEY for a setting that does not count)")
            changes = args.figures == "changes" or (args.figures == "auto" and interleaved(a_ladder[0])
                                                    and interleaved(b_ladder[0]))
            if changes and not (interleaved(c[0]) and interleaved(d[0])):
                raise CompareError("--noise-from: A and B are compared by their changes against the control runs "
                                   "beside their rungs, C or D ran without ladder.interleave (--figures absolute "
                                   "compares A and B as they are)")
            noise = measured_noise(c, d, changes)
            if not noise:
                raise CompareError(f"--noise-from: no metric measured over at least {MIN_NOISE_RUNGS} rungs")
            a_opts, c_opts = ([r["opt"] for r in x[0]["rungs"]] for x in (a_ladder, c))
            if c_opts != a_opts:
                noise_notes.append(f"the noise comes from a ladder with other rungs ({c_opts}) than A's ({a_opts})")
            found = settings_differences(c, a_ladder, tuple(args.ignore))
            if found is not None and (found[0] or found[2]):  # another ladder's noise: said where it is used
                noise_notes.append("the noise comes from a ladder with other settings than A's (C -> A): " + "; ".join(
                    [f"{key}: {vc} -> {va}" for key, vc, va in found[0][:8]]
                    + [f"{dg} differs" for dg in found[2]]) + (", ..." if len(found[0]) > 8 else ""))
        reproduced, lines = compare(a_ladder, b_ladder, args.noise_sd, args.k, tuple(args.ignore), args.verdicts,
                                     noise, args.k_max, args.per_metric, args.figures, how, args.partial)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"A: {args.ladder_a}\nB: {args.ladder_b}" + (f"\nnoise from: {' '.join(args.noise_from)}"
                                                          if args.noise_from else "")
          + "".join(f"\nnote: {n}" for n in noise_notes) + "\n")
    print("\n".join(lines))
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
