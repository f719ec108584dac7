"""Run an A/B: compose each arm from the base config plus its overrides, run the arms on the identical
requests and prompts (alternating when repeated, so machine drift cancels), gate them with abtest/, and
write verdict.json, a review page, a rollout plan and the promoted baseline."""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from hydra import compose
from omegaconf import DictConfig, OmegaConf

from optladder.abtest.gates import GateConfig
from optladder.abtest.lossless import arms_lossless, lossless_check, opts_in_effect_differ, teacher_forcing_covers
from optladder.abtest.rollout import DEFAULT_REGISTRY, promote, rollout_plan
from optladder.abtest.verdict import (ArmResult, Verdict, budget_warnings, check_same_traffic, decide, interim_latency,
                                      verdict_table)
from optladder.engine.loader import resolve_device
from optladder.engine.validation import validate_engine
from optladder.experiments.build import build, check_keys
from optladder.experiments.errors import as_user_error
from optladder.experiments.experiment import ExperimentResult, free_device_memory, run_experiment
from optladder.experiments.preflight import Prepared, prepare
from optladder.experiments.switchback import check_switchback, check_switchback_arms, run_switchback, split_blocks
from optladder.experiments.teacher_forced_run import log_to_run, run_teacher_forced
from optladder.experiments.tracking import Tracker
from optladder.quality.prompts import load_prompt_set, prompts_digest
from optladder.quality.review import write_review_html
from optladder.quality.scoring import score_vs_control, to_metrics
from optladder.quality.teacher_forced import to_metrics as tf_to_metrics
from optladder.traffic.request import requests_digest

log = logging.getLogger(__name__)


@dataclass
class Arm:
    name: str
    overrides: list[str]
    cfg: DictConfig
    runs: list[ExperimentResult]
    prepared: Prepared | None = field(default=None, repr=False)  # the arm's data, checked before any arm runs
    # False: the arm replays but scores no quality prompts (a ladder's control run again beside a rung: its
    # greedy answers are those of its own rung's run)
    score_quality: bool = True

    @property
    def resolved(self) -> dict:
        return OmegaConf.to_container(self.cfg, resolve=True)

    @property
    def environments(self) -> list[dict]:
        """Each run's machine, versions and code, from its config snapshot (optladder/abtest/environment.py)."""
        return [r.snapshot.get("environment") or {} for r in self.runs]


def base_overrides(overrides: list[str]) -> list[str]:
    """The command line minus the A/B or ladder selection itself."""
    own = ("+ab=", "ab.", "+ab.", "+ladder=", "ladder.", "+ladder.")
    return [o for o in overrides if not o.startswith(own)]


def compose_arm(base: list[str], extra: list[str]) -> DictConfig:
    with as_user_error():
        cfg = compose(config_name="config", overrides=[*base, *extra])
        check_keys(cfg)  # before any arm runs: a `+key` typo in an arm's overrides would be dropped silently
    return cfg


def gate_config(cfg: DictConfig) -> GateConfig:
    return GateConfig.from_dict(OmegaConf.to_container(cfg.gate, resolve=True))


def prepare_arms(arms: list[Arm]) -> None:
    """Every arm's config and data checked, and their traffic compared, before the first arm runs: a
    mistake in the candidate must not cost the control's whole replay."""
    for arm in arms:
        with as_user_error():
            conf = build(arm.cfg)
        arm.prepared = prepare(conf)
    first = arms[0]
    for arm in arms[1:]:
        with as_user_error():
            check_same_traffic(_digests(first), _digests(arm))


def prepare_switchback(arms: list[Arm], blocks: int) -> None:
    """What a switchback of these arms cannot run, refused before any engine loads."""
    confs = []
    for arm in arms:
        with as_user_error():
            confs.append(build(arm.cfg))
            check_switchback(confs[-1])
            split_blocks(arm.prepared.workload.requests, blocks)
    with as_user_error():
        check_switchback_arms(confs)


def _digests(arm: Arm) -> ArmResult:
    p = arm.prepared
    return ArmResult(arm.name, {}, [], {}, [], requests_digest(p.workload.requests), prompts_digest(p.items))


def check_rung_engines(cfgs: list[DictConfig]) -> None:
    """A ladder's rung configs refused up front where the engine cannot run them (a CUDA-only opt on a CPU,
    a missing prerequisite), not after the rungs before them ran."""
    for cfg in cfgs:
        with as_user_error():
            engine = OmegaConf.to_object(cfg.engine)
            if engine.name == "reference":
                validate_engine(engine, resolve_device(engine.device).type)


def run_arms(arms: list[Arm], repeats: int, out_dir: Path, parent_run_id: str | None) -> None:
    """Run the arms `repeats` times, the opening arm alternating (AB BA AB ...), so neither always runs first
    in a fresh process nor always later in a drifting machine; quality (greedy) is scored on the first, for the
    arms that score it (Arm.score_quality)."""
    for r in range(repeats):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            tags = {"optladder.arm": arm.name, "optladder.repeat": str(r)}
            res = run_experiment(arm.cfg, out_dir / f"{arm.name}-r{r}", overrides=arm.overrides,
                                 run_name=f"{arm.name} (repeat {r})", parent_run_id=parent_run_id, tags=tags,
                                 with_quality=(r == 0 and arm.score_quality),
                                 prepared=arm.prepared)
            arm.runs.append(res)
            # the arm's engine is closed: its cached device memory goes back to the GPU, so that an engine of
            # another process (engine=vllm's server, which checks free memory at start) gets it
            free_device_memory()


def arm_result(arm: Arm) -> ArmResult:
    first = arm.runs[0]
    return ArmResult(arm.name, dict(first.metrics), first.records, first.quality_per_prompt, first.outputs,
                     first.requests_digest, first.prompts_digest, runs=[x.records for x in arm.runs],
                     environments=arm.environments, blocks=list(first.blocks))


def resolved_dtype(resolved: dict) -> str:
    """The dtype an arm computes in ("bfloat16", "float32", ...), engine.dtype=auto resolved on this host; for an
    endpoint elsewhere (engine=openai) or a value this host cannot resolve, the setting as written."""
    from optladder.engine.loader import resolve_device, resolve_dtype

    engine = resolved.get("engine", {})
    written = str(engine.get("dtype", "auto"))
    if engine.get("name") == "openai":
        return written
    try:
        return str(resolve_dtype(written, resolve_device(engine.get("device", "auto")))).removeprefix("torch.")
    except ValueError:
        return written


def latency_alpha(gate: GateConfig, looks: int) -> float | None:
    """The latency gates' alpha under sequential stopping (ab.looks, ladder.looks): gate.alpha / looks, or None
    for one look (the gates' own alpha)."""
    return gate.alpha / looks if looks > 1 else None


def sequential_stop(gate: GateConfig, looks: int, control: str, candidate: str):
    """Sequential stopping of a switchback (ab.looks, ladder.looks): (latency_alpha; the stop hook run_switchback
    asks at each look, or None). The hook judges the blocks so far of the arms named control and candidate with
    the verdict's own latency gates at that alpha."""
    alpha = latency_alpha(gate, looks)
    if alpha is None:
        return None, None
    lat_gate = replace(gate, alpha=alpha)
    return alpha, lambda arms: interim_latency(arms[control], arms[candidate], lat_gate)[0]


def gate_pair(control: Arm, candidate: Arm, gate: GateConfig,
              latency_alpha: float | None = None) -> tuple[Verdict, ArmResult, bool, str]:
    """The verdict of candidate against control, the candidate's measurements with its scores against the
    control's outputs added, and whether (and why) the candidate counts as lossless."""
    lossless, why = arms_lossless(control.resolved, candidate.resolved)
    check, near = "exact", None
    if lossless:
        no_traces = _no_traces(control, candidate)
        check, how = lossless_check(gate.lossless_check, (resolved_dtype(control.resolved),
                                                          resolved_dtype(candidate.resolved)), no_traces)
        why = f"{why}; checked {CHECK_WORDS[check]} ({how})"
    c, k = arm_result(control), arm_result(candidate)
    check_same_traffic(c, k)  # refused before any statistics: the arms must see the same requests and prompts
    if lossless and check == "near_tie":
        near = near_tie_report(control, candidate, gate, no_traces)
    vs_control = score_vs_control(k.outputs, c.outputs)
    k.metrics.update(to_metrics(vs_control))
    k.quality_per_prompt["quality/rougeL_vs_control"] = [p["rougeL"] for p in vs_control.per_prompt]
    if not lossless or check == "teacher_forced":  # judged teacher-forced against the control
        first = candidate.runs[0]
        items = control.prepared.items if control.prepared is not None else None
        k.teacher_forced = run_teacher_forced(control.cfg, candidate.cfg, c.outputs, first.run_dir, items)
        tf_metrics = tf_to_metrics(k.teacher_forced)
        k.metrics.update(tf_metrics)
        log_to_run(OmegaConf.to_object(candidate.cfg.tracking), first.run_id, tf_metrics)
    random_weights = all(a.resolved.get("model", {}).get("source") == "random" for a in (control, candidate))
    covers = teacher_forcing_covers(control.resolved, candidate.resolved)
    if near is not None:
        k.metrics.update(near.metrics())
        log_to_run(OmegaConf.to_object(candidate.cfg.tracking), candidate.runs[0].run_id, near.metrics())
        write_json(candidate.runs[0].run_dir / "near_tie.json", near.to_dict())
    # the drift bound only where float32 is written in both arms: engine.dtype=auto resolves by the host that judges,
    # which for a ladder resumed elsewhere is not the host that ran it
    float32 = all(str(a.resolved.get("engine", {}).get("dtype")) == "float32" for a in (control, candidate))
    return (decide(c, k, gate, lossless, check, random_weights, covers, near, float32, latency_alpha=latency_alpha),
            k, lossless, why)


def gate_metrics(verdict: Verdict) -> dict[str, float]:
    """Each gate with an interval as the parent run's verdict/* metrics: its change, the interval's ends and, for
    a latency gate, its minimum detectable effect (so an A/A sweep can be read from MLflow)."""
    out: dict[str, float] = {}
    for g in verdict.gates:
        if g.interval is None or not g.metric:
            continue
        name = f"verdict/{g.gate}/{g.metric.replace('/', '_')}"
        out.update({f"{name}_change": g.interval.estimate, f"{name}_low": g.interval.low,
                    f"{name}_high": g.interval.high})
        if g.mde is not None:
            out[f"{name}_mde"] = g.mde
    return {k: v for k, v in out.items() if math.isfinite(v)}


CHECK_WORDS = {"near_tie": "at each fork for a near-tie", "teacher_forced": "teacher-forced", "exact": "exactly"}


def _no_traces(control: Arm, candidate: Arm) -> str | None:
    """Why the arms' answers cannot be judged fork by fork (an arm recorded no log-probs), or None."""
    for arm in (control, candidate):
        first = arm.runs[0]
        if not first.traces:
            return f"the {arm.name}: {first.traces_unavailable or 'no log-probs recorded with its answers'}"
    return None


def near_tie_report(control: Arm, candidate: Arm, gate: GateConfig, no_traces: str | None):
    """The near-tie check of the candidate's greedy answers against the control's (optladder/quality/near_tie.py)."""
    from optladder.quality.near_tie import compare, unavailable

    if no_traces is not None:
        return unavailable(len(control.runs[0].outputs), gate.near_tie_top_k, gate.near_tie_margin, no_traces)
    items = control.prepared.items if control.prepared is not None else None
    ids = [it.id for it in items] if items is not None else None
    return compare(control.runs[0].traces, candidate.runs[0].traces, gate.near_tie_top_k, gate.near_tie_margin, ids)


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=2, default=str))
    return path


def run_ab(cfg: DictConfig, run_dir: Path, overrides: list[str], choices: dict) -> int:
    with as_user_error():
        ab = OmegaConf.to_object(cfg.ab)
        gate = gate_config(cfg)  # before any arm runs: a bad gate must not cost both replays
    base = base_overrides(overrides)
    control = Arm("control", [*base, *ab.control], compose_arm(base, list(ab.control)), [])
    candidate = Arm("candidate", [*base, *ab.candidate], compose_arm(base, list(ab.candidate)), [])
    prepare_arms([control, candidate])
    if ab.design == "switchback":
        prepare_switchback([control, candidate], ab.blocks)
    budget = budget_warnings(gate, len(control.prepared.workload.requests), ab.design, ab.repeats)
    for line in budget:  # before any replay: what this budget cannot resolve, and the fix
        log.warning("budget: %s", line)
    with Tracker(OmegaConf.to_object(cfg.tracking), f"ab:{ab.name}",
                 {"optladder.kind": "ab", "ab": ab.name, "optladder.design": ab.design}, run_dir=run_dir) as parent:
        order = [control, candidate] if ab.first == "control" else [candidate, control]
        looks: list[dict] = []
        # sequential: the latency gates, looked at ab.looks times, each time at alpha / looks, so that peeking keeps
        # their error rates; the quality gates are judged once, at gate.alpha
        lat_alpha, stop = sequential_stop(gate, ab.looks, control.name, candidate.name)
        if ab.design == "switchback":
            looks = run_switchback(order, ab.blocks, run_dir, parent.run_id, progress=bool(cfg.replay.progress),
                                   looks=ab.looks, stop=stop)
        else:
            run_arms(order, ab.repeats, run_dir, parent.run_id)
        verdict, cand, lossless, why = gate_pair(control, candidate, gate, latency_alpha=lat_alpha)
        unasked = opts_in_effect_differ(control.resolved, candidate.resolved, control.runs[0].opts_effective,
                                        candidate.runs[0].opts_effective)
        for line in unasked:
            log.warning("the arms differ in an opt they did not ask to: %s", line)
        out = {"ab": ab.name, "control": control.overrides, "candidate": candidate.overrides, "first": ab.first,
               "repeats": ab.repeats, "design": ab.design, "blocks": ab.blocks if ab.design == "switchback" else None,
               "blocks_played": len(control.runs[0].blocks) if ab.design == "switchback" else None,
               "looks": looks, "alpha": gate.alpha, "latency_alpha": lat_alpha or gate.alpha,
               "budget_warnings": budget, "candidate_lossless": lossless, "lossless_reason": why, "opts_in_effect_differ": unasked,
               **verdict.to_dict(),
               "control_run_ids": [r.run_id for r in control.runs],
               "candidate_run_ids": [r.run_id for r in candidate.runs]}
        write_json(run_dir / "verdict.json", out)
        _review(cfg, run_dir, control, candidate)
        if verdict.status == "pass":
            write_json(run_dir / "rollout_plan.json", rollout_plan(verdict, ab.name))
            registry = Path(ab.registry_dir) if ab.registry_dir else DEFAULT_REGISTRY
            best = candidate.runs[0]
            promote(registry, best.snapshot, best.run_id or str(best.run_dir), ab.name)  # run dir when untracked
        parent.log_metrics({f"verdict/{k}": v for k, v in cand.metrics.items() if k.startswith("quality/")})
        parent.log_metrics({"verdict/exit_code": verdict.exit_code, **gate_metrics(verdict)})
        parent.set_tags({"verdict": verdict.status})
        print(verdict_table(verdict))
        for line in budget:
            print(f"  budget: {line}")
        for line in unasked:
            print(f"  note: the arms differ in an opt they did not ask to: {line}")
        print(f"verdict.json: {run_dir / 'verdict.json'}")
        return verdict.exit_code


def _review(cfg: DictConfig, run_dir: Path, control: Arm, candidate: Arm) -> None:
    """The human spot check: prompts side by side, the ones whose outputs differ first."""
    qcfg = OmegaConf.to_object(cfg.quality)
    items = control.prepared.items if control.prepared else load_prompt_set(qcfg, cfg.data.root)
    write_review_html(run_dir / "review.html", items, control.runs[0].outputs, candidate.runs[0].outputs,
                      n=qcfg.review_prompts,
                      title=f"optladder review: {' '.join(control.overrides) or 'base'} vs "
                            f"{' '.join(candidate.overrides)}")
