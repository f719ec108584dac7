"""The verdict of an A/B: every gate of a `GateConfig` applied to a control and a candidate arm.

Each gate is pass, fail or inconclusive with a reason that carries its numbers; the verdict is fail if
any gate fails, else inconclusive if any gate could not decide, else pass, with exit status 0, 1 or 2
so it can serve as an Argo Rollouts analysis Job or behind a Flagger webhook. A gate never passes on
a metric that was not measured. A lossy candidate is decided by the teacher-forced gates
(optladder/abtest/teacher_forced.py) once they were measured; its text gates are then reported (`decides` False),
except a non-inferiority check that fails. No torch, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
from scipy import stats as sps

from optladder.abtest.environment import across_runs, describe
from optladder.abtest.gates import PAIRED_LATENCY, GateConfig, higher_is_better
from optladder.abtest.run_pairs import _stat, align_runs, block_interval, pair_interval, power, run_noise_from_aa
from optladder.abtest.stats import Interval, bootstrap_mean_delta
from optladder.abtest.teacher_forced import teacher_forced_checks
from optladder.quality.near_tie import NearTieReport
from optladder.quality.teacher_forced import TeacherForcedScores
from optladder.traffic.request import RequestRecord

Status = Literal["pass", "fail", "inconclusive"]
EXIT_CODES: dict[str, int] = {"pass": 0, "fail": 1, "inconclusive": 2}
EXACT_MATCH = "quality/exact_match_vs_control"
# p99.9 is left to point values: over a few hundred requests it is the sample maximum, whose interval misleads.
_QUANTILES = {"mean": None, "p50": 0.50, "p90": 0.90, "p99": 0.99}


@dataclass
class ArmResult:
    """One arm's measurements. quality_per_prompt: metric -> per-prompt scores in prompt order.
    runs: the records of each repeat, run j of both arms being pair j; empty means one run, `records`.
    teacher_forced: a lossy candidate's teacher-forced comparison with the control, per prompt.
    environments: each run's `environment` from its config snapshot (machine, versions, code); empty: unknown."""

    name: str
    metrics: dict[str, float]
    records: list[RequestRecord]
    quality_per_prompt: dict[str, list[float]]
    outputs: list[str]
    requests_digest: str
    prompts_digest: str
    runs: list[list[RequestRecord]] = field(default_factory=list)
    teacher_forced: TeacherForcedScores | None = None
    environments: list[dict[str, Any]] = field(default_factory=list)
    # a switchback A/B (optladder/experiments/switchback.py): the records of each block, block b of both arms
    # being the same requests replayed back to back; empty for design=runs
    blocks: list[list[RequestRecord]] = field(default_factory=list)

    def all_runs(self) -> list[list[RequestRecord]]:
        return self.runs or [self.records]

    def value(self, metric: str) -> float | None:
        v = self.metrics.get(metric)
        return float(v) if v is not None and math.isfinite(v) else None


@dataclass
class GateResult:
    gate: str
    metric: str
    status: Status
    reason: str
    control: float | None
    candidate: float | None
    interval: Interval | None = None
    bound: float | None = None  # relative gates: the largest bad-direction change that passes
    decides: bool = True  # False: reported only (a lossy candidate's text gates, when teacher forcing decides)
    # latency gates on an interval: the minimum detectable effect (80% power) and, when undecided, about how many
    # run pairs in all would decide it (optladder/abtest/run_pairs.py power)
    mde: float | None = None
    pairs_to_decide: float | None = None

    @property
    def name(self) -> str:
        return f"{self.gate}:{self.metric}"


@dataclass
class Verdict:
    status: Status
    gates: list[GateResult]
    exit_code: int
    control: str = ""
    candidate: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (verdict.json): non-finite numbers become None, the reason keeps them in words."""
        return _jsonable(asdict(self))


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _pct(x: float) -> str:
    return f"{x:+.2%}" if math.isfinite(x) else ("+inf" if x > 0 else "-inf")


def _ci(iv: Interval, alpha: float) -> str:
    return f"{_pct(iv.estimate)} [{round((1 - alpha) * 100, 2):g}% CI {_pct(iv.low)}, {_pct(iv.high)}; n={iv.n}]"


def _unmeasured(gate: str, metric: str, c: float | None, k: float | None) -> GateResult:
    missing = " and ".join(a for a, v in (("control", c), ("candidate", k)) if v is None)
    arms = "arms" if " and " in missing else "arm"
    return GateResult(gate, metric, "inconclusive", f"{metric} was not measured in the {missing} {arms}",
                      c, k)


def _rel_change(c: float, k: float) -> float:
    if c == 0:
        return 0.0 if k == 0 else math.copysign(math.inf, k)
    return (k - c) / c


def on_bound(low: float, high: float, bound: float) -> Status:
    """Status of a 'bad-direction change <= bound' check over an interval of that change."""
    if high <= bound:
        return "pass"
    return "fail" if low > bound else "inconclusive"


def _relative_gate(gate: str, metric: str, bound: float, control: ArmResult, candidate: ArmResult,
                   cfg: GateConfig) -> GateResult:
    """Candidate's relative change of metric, in its bad direction, must be <= bound."""
    c, k = control.value(metric), candidate.value(metric)
    if c is None or k is None:
        return _unmeasured(gate, metric, c, k)
    sign = -1.0 if higher_is_better(metric) else 1.0
    head = f"{metric}: control {c:.4g}, candidate {k:.4g}; change"
    limit = (f"allowed at most {bound + 0.0:.2%} worse" if bound >= 0 else  # + 0.0: -0.0 prints as 0.00%
             f"required at least {-bound:.2%} better")
    m = PAIRED_LATENCY.match(metric)
    if m is None or not (control.records and candidate.records):
        status: Status = "pass" if sign * _rel_change(c, k) <= bound else "fail"
        return GateResult(gate, metric, status, f"{head} {_pct(_rel_change(c, k))} (point values); "
                          f"{limit} -> {status}", c, k)
    kind, stat = m.groups()
    if control.blocks and candidate.blocks:
        return _switchback_gate(gate, metric, bound, control, candidate, cfg, kind, stat, sign, head, limit, c, k)
    ctrl_runs, cand_runs = control.all_runs(), candidate.all_runs()
    pairs = min(len(ctrl_runs), len(cand_runs))
    values, dropped = align_runs(ctrl_runs[:pairs] + cand_runs[:pairs], kind)
    if values.shape[1] < cfg.min_pairs:
        return GateResult(gate, metric, "inconclusive", f"{head} {_pct(_rel_change(c, k))}, but only "
                          f"{values.shape[1]} requests ok in every run ({dropped} dropped), fewer than "
                          f"gate.min_pairs={cfg.min_pairs}", c, k)
    prior = cfg.run_noise.get(metric)
    try:
        iv = pair_interval(values[:pairs], values[pairs:], _QUANTILES[stat], prior, cfg.run_noise_weight,
                           alpha=cfg.alpha, n_boot=cfg.n_boot, seed=cfg.seed)
    except ValueError as e:
        return GateResult(gate, metric, "inconclusive", f"{head} {_pct(_rel_change(c, k))}; no interval: {e}",
                          c, k)
    low, high = sorted((sign * iv.low, sign * iv.high))
    status = on_bound(low, high, bound)
    noise = (f"run noise SD {iv.run_sd:.1%} from {pairs - 1} df of the pairs"
             + (f" and gate.run_noise {prior:.1%} x {cfg.run_noise_weight:g}" if prior is not None else ""))
    pw = power(iv, bound, sign, cfg.alpha, status != "inconclusive")
    resolves = f"; this run resolves changes of ±{pw.mde:.1%} (80% power)"
    if pw.pairs_to_decide is not None:
        resolves += (", and its estimate lies on the bound: no number of pairs would decide it"
                     if math.isinf(pw.pairs_to_decide) else
                     f"; about {pw.pairs_to_decide:.0f} run pairs in all (ab.repeats) would decide it")
    return GateResult(gate, metric, status, f"{head} {_ci(iv, cfg.alpha)} over {pairs} run pair(s) "
                      f"({dropped} requests dropped; {noise}){resolves}; {limit} -> {status}", c, k, iv, bound,
                      mde=pw.mde, pairs_to_decide=pw.pairs_to_decide)


def _switchback_gate(gate: str, metric: str, bound: float, control: ArmResult, candidate: ArmResult,
                     cfg: GateConfig, kind: str, stat: str, sign: float, head: str, limit: str, c: float,
                     k: float) -> GateResult:
    """A latency gate of a switchback A/B: the pooled requests of all blocks, the interval from resampling blocks
    (optladder/abtest/run_pairs.py block_interval); gate.run_noise is not needed (the blocks measure their own)."""
    if len(control.blocks) != len(candidate.blocks):
        return GateResult(gate, metric, "inconclusive", f"{head} {_pct(_rel_change(c, k))}; the arms have "
                          f"{len(control.blocks)} and {len(candidate.blocks)} blocks, not one pair a block", c, k)
    ctrl, cand, dropped = [], [], 0
    for cb, kb in zip(control.blocks, candidate.blocks):
        values, drop = align_runs([cb, kb], kind)
        dropped += drop
        if values.shape[1]:
            ctrl.append(values[0])
            cand.append(values[1])
    n = sum(x.size for x in ctrl)
    if n < cfg.min_pairs or len(ctrl) < 2:
        return GateResult(gate, metric, "inconclusive", f"{head} {_pct(_rel_change(c, k))}, but only {n} "
                          f"requests in {len(ctrl)} blocks ok in both arms ({dropped} dropped), fewer than "
                          f"gate.min_pairs={cfg.min_pairs} or 2 blocks", c, k)
    q, tail = _QUANTILES[stat], ""
    if q is not None and n * (1 - q) < MIN_TAIL_REQUESTS:
        # the budget cannot resolve this tail (its estimate is about the largest value, and resampling blocks
        # understates how much that moves): gated on the highest percentile it does resolve, said so
        q_eff, name = resolvable(n, q)
        tail = (f"; p{q * 100:g} of {n} requests has {n * (1 - q):.1f} beyond it (about their largest): gated on "
                f"{name} instead, which {n} requests resolve ({tail_requests_needed(q)} give p{q * 100:g} "
                f"{MIN_TAIL_REQUESTS} beyond it: workload.num_requests)")
        q = q_eff
    try:
        iv = block_interval(ctrl, cand, q, alpha=cfg.alpha, n_boot=cfg.n_boot, seed=cfg.seed)
    except ValueError as e:
        return GateResult(gate, metric, "inconclusive", f"{head} {_pct(_rel_change(c, k))}; no interval: {e}",
                          c, k)
    low, high = sorted((sign * iv.low, sign * iv.high))
    status = on_bound(low, high, bound)
    if tail and status == "pass":  # the lower percentile clears the bound; the tail asked for is not measured
        status = "inconclusive"
        tail += "; a pass there does not pass the tail asked for (a fail does fail it)"
    pw = power(iv, bound, sign, cfg.alpha, status != "inconclusive")
    resolves = f"; this run resolves changes of ±{pw.mde:.1%} (80% power)"
    if pw.pairs_to_decide is not None:
        resolves += (", and its estimate lies on the bound: no number of blocks would decide it"
                     if math.isinf(pw.pairs_to_decide) else
                     f"; about {pw.pairs_to_decide:.0f} blocks of this size (ab.blocks, more requests) would "
                     "decide it")
    return GateResult(gate, metric, status, f"{head} {_ci(iv, cfg.alpha)} over {n} requests in {len(ctrl)} "
                      f"switchback blocks ({dropped} requests dropped; interval from resampling blocks){tail}"
                      f"{resolves}; {limit} -> {status}", c, k, iv, bound, mde=pw.mde,
                      pairs_to_decide=pw.pairs_to_decide)


def interim_latency(control_blocks: list[list[RequestRecord]], candidate_blocks: list[list[RequestRecord]],
                    cfg: GateConfig) -> tuple[Status | None, list[GateResult]]:
    """An interim look of a sequential switchback (ab.looks): the latency gates on the blocks played so far, each
    interval at cfg.alpha (the caller passes alpha / looks). 'fail' where one of them fails, 'pass' where every one
    passes, None while any is undecided or none is on an interval (then there is nothing to stop early on)."""
    results = []
    for gate, bounds, sign_flip in (("latency_gain", cfg.latency_gains, -1.0),
                                    ("latency_max_regression", cfg.latency_max_regression, 1.0)):
        for metric, b in bounds.items():
            m = PAIRED_LATENCY.match(metric)
            if m is None:
                continue  # a point value (throughput): judged once, at the end
            ctrl = ArmResult("control", {}, [r for x in control_blocks for r in x], {}, [], "", "",
                             blocks=control_blocks)
            cand = ArmResult("candidate", {}, [r for x in candidate_blocks for r in x], {}, [], "", "",
                             blocks=candidate_blocks)
            sign = -1.0 if higher_is_better(metric) else 1.0
            results.append(_switchback_gate(gate, metric, sign_flip * b, ctrl, cand, cfg, *m.groups(), sign,
                                            f"{metric} (interim): change", "", math.nan, math.nan))
    statuses = {r.status for r in results}
    if "fail" in statuses:
        return "fail", results
    return ("pass" if statuses == {"pass"} else None), results


MIN_TAIL_REQUESTS = 5  # requests beyond a percentile for it to be more than the sample's few largest values


def tail_requests_needed(q: float, tail: int = MIN_TAIL_REQUESTS) -> int:
    """How many requests a q-quantile needs for `tail` of them to lie beyond it (p99: 500 for 5)."""
    return math.ceil(tail / (1.0 - q) - 1e-9)


def resolvable(n: int, q: float) -> tuple[float | None, str]:
    """The highest of the gates' percentiles below q that n requests resolve (MIN_TAIL_REQUESTS beyond it), or
    the mean: (quantile or None, its name)."""
    for name, x in sorted(((k, v) for k, v in _QUANTILES.items() if v is not None), key=lambda kv: -kv[1]):
        if x < q and n * (1 - x) >= MIN_TAIL_REQUESTS:
            return x, name
    return None, "the mean"


def budget_warnings(cfg: GateConfig, requests: int, design: str, repeats: int) -> list[str]:
    """What the latency gates cannot resolve with this budget, said before any replay: a percentile with fewer
    than MIN_TAIL_REQUESTS requests beyond it (it is then about their maximum), and under design=runs a run noise
    prior (gate.run_noise) that alone makes the interval wider than the bound, with the fix."""
    out = []
    gates = {**{m: ("latency_max_regression", b) for m, b in cfg.latency_max_regression.items()},
             **{m: ("latency_gains", b) for m, b in cfg.latency_gains.items()}}
    for metric, (gate, bound) in gates.items():
        m = PAIRED_LATENCY.match(metric)
        if m is None:
            continue
        q = _QUANTILES[m.group(2)]
        if q is not None and requests * (1 - q) < MIN_TAIL_REQUESTS:
            need = tail_requests_needed(q)
            lower = [s for s, x in _QUANTILES.items() if x is not None and requests * (1 - x) >= MIN_TAIL_REQUESTS]
            low = f"{metric.rsplit('_', 1)[0]}_{lower[-1]}" if lower else ""
            gated = cfg.latency_gains if gate == "latency_gains" else cfg.latency_max_regression
            alt = ("" if not low else
                   f", or drop it: {low} is gated already ('++gate.{gate}={{{metric}:null}}')" if low in gated else
                   f", or gate {low} instead ('++gate.{gate}={{{metric}:null,{low}:{bound:g}}}')")
            out.append(f"gate.{gate}[{metric}] over {requests} requests: {requests * (1 - q):.1f} lie beyond "
                       f"p{q * 100:g}, so it is about their largest value; {need} requests give it "
                       f"{MIN_TAIL_REQUESTS} (workload.num_requests={need}){alt}")
        prior = cfg.run_noise.get(metric)
        if design != "runs":
            continue
        if prior is None and repeats < 2:
            out.append(f"gate.{gate}[{metric}]: one run pair and no gate.run_noise[{metric}]: its interval has no "
                       "measure of run-to-run noise and cannot decide; set ab.design=switchback, ab.repeats>=2, or "
                       "gate.run_noise from an A/A sweep")
            continue
        if prior is None:
            continue

        def floor(pairs: int) -> float:  # the MDE of the run noise alone, the requests' own spread left out
            df = cfg.run_noise_weight + pairs - 1
            t = float(sps.t.ppf(1 - cfg.alpha / 2, df)) + float(sps.t.ppf(0.8, df))
            return math.expm1(t * prior / math.sqrt(pairs))

        if abs(bound) > 0 and floor(repeats) > abs(bound):
            need = next((n for n in range(repeats + 1, 201) if floor(n) <= abs(bound)), None)
            more = f"ab.repeats>={need}" if need else "more run pairs than 200"
            out.append(f"gate.{gate}[{metric}] bound {abs(bound):.0%}: the run noise alone (gate.run_noise "
                       f"{prior:.0%}) gives {repeats} run pair(s) a detectable effect of ±{floor(repeats):.0%} at "
                       f"80% power, wider than the bound, so it can hardly decide; set ab.design=switchback (the "
                       f"blocks measure their own noise) or {more}")
    return out


def aa_log_ratio(metric: str, first: list, again: list) -> float | None:
    """ln(stat(again) / stat(first)) of a paired latency metric (perf/e2e_ms_p99, ...) over two runs of one config
    (an A/A pair), on the requests ok in both, as a latency gate pairs them; None when the metric is not a paired
    latency or fewer than two requests are there."""
    m = PAIRED_LATENCY.match(metric)
    if m is None or not (first and again):
        return None
    kind, stat = m.groups()
    values, _ = align_runs([first, again], kind)
    if values.shape[1] < 2:
        return None
    a, b = (float(x) for x in _stat(values, _QUANTILES[stat]))
    return math.log(b / a) if a > 0 and b > 0 else None


def pooled_run_noise(cfg: GateConfig, log_ratios: dict[str, list[float]]) -> tuple[GateConfig, dict[str, dict]]:
    """gate.run_noise pooled with A/A pairs measured alongside (a ladder's control runs beside its rungs): for each
    metric of gate.run_noise, SD = sqrt((weight x prior^2 + sum d^2) / (weight + pairs)), the prior counting
    run_noise_weight pairs as before and each A/A pair one degree of freedom (its true log ratio is 0); the weight
    becomes weight + pairs, the fewest of any metric of gate.run_noise (0 for one without pairs: one weight serves
    every metric, and none may be given more degrees of freedom than it has). Returns the config to gate with and,
    per metric, what was pooled."""
    w = cfg.run_noise_weight
    noise, used = dict(cfg.run_noise), {}
    for metric, prior in cfg.run_noise.items():
        d = log_ratios.get(metric) or []
        if d:
            noise[metric] = math.sqrt((w * prior ** 2 + sum(x * x for x in d)) / (w + len(d)))
            used[metric] = {"prior": prior, "prior_weight": w, "pairs": len(d), "aa_rms": run_noise_from_aa(d)[0],
                            "pooled": noise[metric]}
    if not used:
        return cfg, {}
    pairs = min(used[m]["pairs"] if m in used else 0 for m in cfg.run_noise)  # the df no metric overstates
    return replace(cfg, run_noise=noise, run_noise_weight=w + pairs), used


def _quality_gate(metric: str, margin: float, control: ArmResult, candidate: ArmResult,
                  cfg: GateConfig) -> GateResult:
    """Non-inferiority: candidate >= control * (1 - margin), on the paired per-prompt interval."""
    gate = "quality_non_inferiority"
    c, k = control.value(metric), candidate.value(metric)
    pc, pk = control.quality_per_prompt.get(metric), candidate.quality_per_prompt.get(metric)
    if not (pc and pk):
        if c is None or k is None:
            return _unmeasured(gate, metric, c, k)
        status: Status = "pass" if k >= c * (1 - margin) else "fail"
        return GateResult(gate, metric, status, f"{metric}: control {c:.4g}, candidate {k:.4g}, change "
                          f"{_pct(_rel_change(c, k))} (point values, no per-prompt scores); margin "
                          f"-{margin:.2%} -> {status}", c, k)
    if len(pc) != len(pk):
        raise ValueError(f"{metric}: per-prompt scores differ in length (control {len(pc)}, "
                         f"candidate {len(pk)}) although the prompts digests match")
    c = float(np.mean(pc)) if c is None else c
    k = float(np.mean(pk)) if k is None else k
    if len(pc) < cfg.min_pairs:
        return GateResult(gate, metric, "inconclusive", f"{metric}: only {len(pc)} prompts scored, fewer "
                          f"than gate.min_pairs={cfg.min_pairs}", c, k)
    # A control that scores 0 everywhere cannot be undercut by more than 0: the bound is absolute.
    relative = bool(np.mean(pc) != 0)
    iv = bootstrap_mean_delta(np.asarray(pc), np.asarray(pk), n_boot=cfg.n_boot, seed=cfg.seed,
                              alpha=cfg.alpha, relative=relative)
    bound = -margin if relative else 0.0
    status = "pass" if iv.low >= bound else ("fail" if iv.high < bound else "inconclusive")
    span = _ci(iv, cfg.alpha) if relative else f"{iv.estimate:+.4g} [{iv.low:+.4g}, {iv.high:+.4g}]"
    return GateResult(gate, metric, status, f"{metric}: control {c:.4g}, candidate {k:.4g}; per-prompt "
                      f"mean change {span} paired by prompt; margin -{margin:.2%} -> {status}", c, k, iv)


def _exact_match_gate(candidate: ArmResult, minimum: float) -> GateResult:
    k = candidate.value(EXACT_MATCH)
    if k is None:
        # the control's agreement with itself is 1 by definition; only the candidate measures it
        return _unmeasured("exact_match", EXACT_MATCH, 1.0, None)
    status: Status = "pass" if k >= minimum else "fail"
    return GateResult("exact_match", EXACT_MATCH, status, f"lossless candidate: {k:.2%} of outputs equal "
                      f"the control's, required {minimum:.2%} -> {status}", None, k)


NEAR_TIE = "quality/near_tie_not_near"


def _near_tie_gate(report: NearTieReport | None, max_drift: float | None = None) -> GateResult:
    """A lossless candidate's forks (optladder/quality/near_tie.py): pass when every one is a near-tie, fail naming
    the prompts and positions of those that are not; inconclusive when no check could be made."""
    if report is None or report.unavailable:
        why = report.unavailable if report is not None else "no near-tie report was made"
        return GateResult("near_tie", NEAR_TIE, "inconclusive", f"the lossless check could not be made: {why}",
                          None, None)
    if not report.equal and not report.diverged:
        return GateResult("near_tie", NEAR_TIE, "inconclusive", f"no answers to compare: none of the {report.prompts} "
                          "prompts left room to answer in both arms", None, None)
    if report.diverged:
        head = (f"{report.equal} of {report.prompts} answers equal the control's and {report.diverged} part from it, "
                f"{report.near_ties} of those at a near-tie (within the other arm's top {report.top_k} and "
                f"{report.margin:g} nats of its top token)")
    else:
        head = f"all {report.equal} of {report.prompts} answers equal the control's"
    worst = report.worst_margin
    worst_s = f"{worst:.3f} nats" if math.isfinite(worst) else "outside the top-k"
    bad = report.offenders
    if bad:
        shown = "; ".join(f.describe() for f in bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        return GateResult("near_tie", NEAR_TIE, "fail", f"{head}; {len(bad)} not a near-tie, so the switch changed "
                          f"what the model computes: {shown} -> fail", 0.0, float(len(bad)))
    if max_drift is not None and report.max_drift > max_drift:
        return GateResult("near_tie", NEAR_TIE, "fail", f"{head}; but before any fork a chosen token's log-prob "
                          f"differs by {report.max_drift:.4g} nats between the arms, more than float32 rounding "
                          f"allows (gate.near_tie_max_drift_float32={max_drift:g}): the switch changed what the model "
                          f"computes -> fail", 0.0, report.max_drift)
    if report.skipped:
        return GateResult("near_tie", NEAR_TIE, "inconclusive", f"{head}; but {len(report.skipped)} prompt(s) were "
                          f"answered by one arm only ({', '.join(report.skipped[:5])})", 0.0, 0.0)
    fork = f"; the widest fork's margin is {worst_s}" if report.diverged else ""
    return GateResult("near_tie", NEAR_TIE, "pass", f"{head}{fork}; a chosen token's log-prob drifts by at most "
                      f"{report.max_drift:.3f} nats between the arms before any fork -> pass", 0.0, 0.0)


def _agreement_gate(metric: str, floor: float, candidate: ArmResult) -> GateResult:
    k = candidate.value(metric)
    if k is None:
        return _unmeasured("control_agreement", metric, None, None)
    status: Status = "pass" if k >= floor else "fail"
    return GateResult("control_agreement", metric, status, f"{metric}: candidate's outputs scored against the "
                      f"control's: {k:.4g}, required at least {floor:.4g} -> {status}", None, k)


def _ceiling_gate(metric: str, ceiling: float, control: ArmResult, candidate: ArmResult) -> GateResult:
    c, k = control.value(metric), candidate.value(metric)
    if k is None:
        return _unmeasured("memory_ceiling", metric, c, k)
    status: Status = "pass" if k <= ceiling else "fail"
    was = "" if c is None else f" (control {c:.4g} GB)"
    return GateResult("memory_ceiling", metric, status, f"{metric}: candidate {k:.4g} GB{was}, ceiling "
                      f"{ceiling:.4g} GB -> {status}", c, k)


def check_same_traffic(control: ArmResult, candidate: ArmResult) -> None:
    for what in ("requests_digest", "prompts_digest"):
        a, b = getattr(control, what), getattr(candidate, what)
        if a != b:
            raise ValueError(f"A/B refused: the arms must replay identical traffic and prompts, but "
                             f"{what} differs (control {a[:16]!r}, candidate {b[:16]!r})")


RANDOM_REPORTED = ("quality/top1_agree_vs_control", "quality/ppl_ref_rel_change")


def _teacher_forced_gates(candidate: ArmResult, gate: GateConfig, random_weights: bool = False) -> list[GateResult]:
    checks = teacher_forced_checks(candidate.teacher_forced, gate.teacher_forced_bounds(), gate.n_boot, gate.seed,
                                   gate.alpha, gate.min_pairs)
    out = [GateResult("teacher_forced", c.metric, c.status, c.reason, None, c.value, c.interval) for c in checks]
    if random_weights:  # no confident token to agree on, no language to be perplexed by: the KL decides
        _reported([g for g in out if g.metric in RANDOM_REPORTED],
                  "random weights: their next-token distributions are near-ties (flash_attn on the H200: KL 0.002, "
                  "top-1 agreement 88%) and their perplexity means nothing; the KL decides")
    return out


def _undecided_if_failed(results: list[GateResult], why: str) -> None:
    for r in results:
        if r.status == "fail":
            r.status, r.reason = "inconclusive", f"{r.reason}; {why}"


def _reported(results: list[GateResult], why: str, unless_failed: bool = False) -> list[GateResult]:
    """Mark text gates as reported only; with unless_failed, a failing one still decides."""
    for r in results:
        if not (unless_failed and r.status == "fail"):
            r.decides, r.reason = False, f"{r.reason} (reported: {why})"
    return results


MEASURED_ON_MACHINE = ("latency_gain", "latency_max_regression")  # relative: a ceiling holds on any machine


def _environment_gate(control: ArmResult, candidate: ArmResult, mode: str,
                      results: list[GateResult]) -> list[GateResult]:
    """gate.environment_check (optladder/abtest/environment.py): runs measured on different machines, software or code
    make the latency gates, which compare the arms, report instead of deciding ("latency"), and one gate says why."""
    diffs = across_runs(control.environments, candidate.environments) if mode != "ignore" else []
    if not diffs:
        return []
    what = describe(diffs)
    if mode == "report":
        return [GateResult("environment", "", "inconclusive",
                           f"{what}; the latency gates decided anyway (gate.environment_check=report)",
                           None, None, decides=False)]
    latency = [r for r in results if r.gate in MEASURED_ON_MACHINE and r.decides]
    if not latency:  # nothing compared across the machines: said, not deciding
        return [GateResult("environment", "", "inconclusive", f"{what}; no latency gate to keep from deciding",
                           None, None, decides=False)]
    _reported(latency, "measured on different machines or code, see the environment gate")
    return [GateResult("environment", "", "inconclusive",
                       f"{what}: a latency change measured across them cannot be told from the "
                       "environments' difference, so those gates do not decide; run both arms on one machine "
                       "(a resumed ladder does, ladder.rerun_control) or set gate.environment_check=report", None, None)]


def decide(control: ArmResult, candidate: ArmResult, gate: GateConfig,
           candidate_lossless: bool, lossless_check: str = "exact", random_weights: bool = False,
           tf_covers: bool = True, near_tie: NearTieReport | None = None, float32: bool = False,
           latency_alpha: float | None = None) -> Verdict:
    """Apply every gate; see the module docstring for how they combine. A lossy candidate, and a lossless one
    whose check is teacher_forced (gate.lossless_check, optladder/abtest/lossless.py), is judged on the teacher-forced
    gates where they are set and were measured; its text gates are then reported. For a lossless candidate:
    random_weights (both arms): of those, the KL gates decide, top-1 agreement and perplexity are reported;
    tf_covers False (it differs in a switch the teacher-forced pass does not run, optladder/abtest/lossless.py): its exact
    match still decides, a failed one counting as inconclusive; scores not measured: its exact match decides.
    lossless_check near_tie: the near-tie gate over `near_tie` decides (float32: both arms compute in it, so the
    drift before the forks is gated too) (inconclusive without one), its exact match
    and agreement are reported, and a non-inferiority check against the references decides only by failing."""
    check_same_traffic(control, candidate)
    quality = [_quality_gate(m, margin, control, candidate, gate) for m, margin in gate.quality_margins_rel.items()]
    agreement = [_agreement_gate(m, floor, candidate) for m, floor in gate.control_agreement_min.items()]
    forced = not candidate_lossless or lossless_check == "teacher_forced"
    tf = _teacher_forced_gates(candidate, gate, random_weights and candidate_lossless) if forced else []
    tf_measured = candidate.teacher_forced is not None and not candidate.teacher_forced.unavailable
    exact = [_exact_match_gate(candidate, gate.min_exact_match_lossless)] if candidate_lossless else []
    tie = []
    if candidate_lossless and lossless_check == "near_tie":
        tie = [_near_tie_gate(near_tie, gate.near_tie_max_drift_float32 if float32 else None)]
        why = "a lossless candidate is decided by where its answers part from the control's (gate.lossless_check)"
        _reported(exact, f"{why}; a rounding change flips near-ties and the answer after them")
        _reported(agreement, f"{why}; a rounding change rewrites the answer after a flipped near-tie")
        _reported(quality, f"{why}; a non-inferiority check decides only by failing", unless_failed=True)
    if tf and candidate_lossless and not tf_measured:  # nothing finer measured: the exact match decides, as in float32
        _reported(tf, "a lossless candidate whose teacher-forced scores are missing is decided by its exact match")
    elif tf and tf_measured:
        if candidate_lossless:
            why = ("a lossless candidate checked teacher-forced is decided by the teacher-forced gates "
                   "(gate.lossless_check)")
            if tf_covers:
                _reported(exact, f"{why}; a rounding change flips near-ties and the answer after them")
            else:
                _undecided_if_failed(exact, "teacher forcing does not run this switch (it acts in the decode steps or "
                                            "the scheduler), so answers that differ cannot be told from rounding "
                                            "flips of near-ties: undecided, not failed")
        else:
            why = "a lossy candidate is decided by the teacher-forced gates"
        _reported(quality, f"{why}; a non-inferiority check decides only by failing", unless_failed=True)
        _reported(agreement, f"{why}; a lossy change rewrites some answers" if not candidate_lossless
                  else f"{why}; a rounding change rewrites some answers")
    results = quality + tie + exact + agreement
    # a sequential switchback (ab.looks) looked at the latency gates K times: they, and only they, at alpha / K
    lat = gate if latency_alpha is None else replace(gate, alpha=latency_alpha)
    results += [_relative_gate("latency_gain", m, -gain, control, candidate, lat)
                for m, gain in gate.latency_gains.items()]
    results += [_relative_gate("latency_max_regression", m, reg, control, candidate, lat)
                for m, reg in gate.latency_max_regression.items()]
    results += [_ceiling_gate(m, ceiling, control, candidate)
                for m, ceiling in gate.memory_ceilings_gb.items()]
    results += tf
    if not results:
        # An empty gate config checks nothing; passing it would promote anything.
        results.append(GateResult("config", "", "inconclusive", "no gates configured: nothing was "
                                  "checked", None, None))
    results += _environment_gate(control, candidate, gate.environment_check, results)
    statuses = {r.status for r in results if r.decides}
    status: Status = "fail" if "fail" in statuses else (
        "inconclusive" if "inconclusive" in statuses else "pass")
    return Verdict(status, results, EXIT_CODES[status], control.name, candidate.name)


def verdict_table(verdict: Verdict) -> str:
    """The verdict and each gate on a line of its own, for the terminal."""
    lines = [f"verdict: {verdict.status.upper()} (exit {verdict.exit_code})"]
    for g in verdict.gates:
        status = g.status if g.decides else f"{g.status}, rep."
        lines.append(f"  [{status:>12}] {g.gate}:{g.metric}  {g.reason}")
    return "\n".join(lines)
