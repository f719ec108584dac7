"""Run a ladder: the baseline, then one more opt per rung, each rung gated against the last accepted one
(optladder/abtest/ladder.py decides which opts a rung runs and whether it is kept). Writes ladder.json, ladder.md and
ladder.png (and with replay.load_levels the load curves and Pareto frontier of the rungs), in one MLflow
parent run with a child run per rung."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from optladder.abtest.environment import across_runs, describe, differences
from optladder.abtest.ladder import keeps, ladder_chart, ladder_table, rung_opts
from optladder.abtest.verdict import ArmResult, Verdict, aa_log_ratio, pooled_run_noise, verdict_table
from optladder.experiments.switchback import run_switchback
from optladder.experiments.ab_run import (Arm, base_overrides, check_rung_engines, compose_arm, free_device_memory, gate_config,
                                gate_pair, latency_alpha, prepare_arms, prepare_switchback, run_arms,
                                sequential_stop)
from optladder.experiments.errors import as_user_error
from optladder.experiments.lifecycle import raise_if_terminated
from optladder.experiments.load_curves import write_load_curves
from optladder.experiments.resume import find_rung, resume_rung, take_rung
from optladder.experiments.snapshot import SNAPSHOT_FILE, environment
from optladder.experiments.tracking import Tracker
from optladder.quality.prompts import prompts_digest
from optladder.traffic.request import requests_digest


log = logging.getLogger(__name__)
RunRung = Callable[[str, list[str], "Arm | None"], Arm]  # (arm name, opts on, its control) -> the arm, runs done
Judge = Callable[[Arm, Arm], tuple[Verdict, ArmResult]]  # (last accepted, candidate) -> verdict, candidate
OnRow = Callable[[list[dict], list[str]], None]  # (ladder.json's rows so far, the opts accepted so far)


def run_ladder(cfg: DictConfig, run_dir: Path, overrides: list[str], choices: dict) -> int:
    """ladder.resume_from: rungs that finished in that earlier run directory are read back, not run
    (optladder/experiments/resume.py); before a rung runs here against a read-back control, that control runs again here
    when ladder.rerun_control says so (`differs`: its machine, versions or code differ from this process's), and
    each rung is judged against the runs of its control made in its own environment where there are any;
    ladder.interleave: each rung runs beside a run of its control made just before it and is gated against
    that (a read-back rung is taken only with its run beside it), with gate.run_noise pooled with the A/A pairs
    so far (ladder.pool_noise); ladder.stop_on_error: whether a rung that raises ends the ladder."""
    with as_user_error():
        ladder = OmegaConf.to_object(cfg.ladder)
        gate = gate_config(cfg)
    base = base_overrides(overrides)
    baseline = Arm("rung0-baseline", list(base), compose_arm(base, []), [])
    prepare_arms([baseline])  # the rungs differ in opts only: they replay and score the baseline's data
    if ladder.design == "switchback":
        prepare_switchback([baseline], ladder.blocks)
    check_rung_engines([compose_arm(base, [f"+opt=[{','.join(ladder.rungs[:i])}]"])
                        for i in range(1, len(ladder.rungs) + 1)])
    with Tracker(OmegaConf.to_object(cfg.tracking), f"ladder:{ladder.name}",
                 {"optladder.kind": "ladder", "ladder": ladder.name}, run_dir=run_dir) as parent:
        first_runs = []

        p = baseline.prepared
        digests = (requests_digest(p.workload.requests), prompts_digest(p.items))
        read_back: set[str] = set()  # rungs taken from ladder.resume_from, not run here
        again: dict[str, list[Arm]] = {}  # such a rung run again (here, or by an earlier resume), by its name
        beside: dict[str, Arm] = {}  # ladder.interleave: a rung's name -> its control run beside it
        aa: dict[str, list[float]] = {}  # gate.run_noise's metrics -> the A/A pairs' log ratios so far
        pooled: dict[str, dict] = {}  # a rung's name -> the run noise its latency gates used (ladder.pool_noise)
        paired: set[str] = set()  # the control runs (their directories) an A/A pair was taken from
        failed: set[str] = set()  # rungs whose run again failed here: not tried twice
        # ladder.looks: each rung's latency gates at gate.alpha / looks (at every look and at the end), its quality
        # gates once at gate.alpha; the looks each switchback made, by rung
        lat_alpha = latency_alpha(gate, ladder.looks)
        looks_made: dict[str, list[dict]] = {}

        def run_rung(name: str, opts: list[str], prev: Arm | None = None) -> Arm:
            extra = [f"+opt=[{','.join(opts)}]"]
            arm = Arm(name, [*base, *extra], compose_arm(base, extra), [], baseline.prepared) if opts else baseline
            switchback = ladder.design == "switchback"
            pair = (ladder.interleave or switchback) and prev is not None
            ctl = Arm(f"{prev.name}{AGAIN}-{name}", prev.overrides, prev.cfg, [], prev.prepared,
                      score_quality=False) if pair else None
            if ctl is not None:
                beside[name] = ctl  # its runs, once there are any, are in ladder.json's row (an error row's too)
            src = Path(ladder.resume_from) if ladder.resume_from else None
            earlier = src and find_rung(src, name, ladder.repeats, arm.resolved, digests)
            if earlier and ctl is not None:  # the rung stands only with the control run beside it
                ctl_runs = find_rung(src, ctl.name, ladder.repeats, prev.resolved, digests)
                # a run beside that scored no answers stands on the control's own, which must then come from its
                # environment (not a control made again here on another machine or code)
                if ctl_runs and (ctl_runs[0].outputs or not across_runs(
                        prev.environments[:1], [ctl_runs[0].snapshot.get("environment") or {}])):
                    ctl.runs = take_rung(ctl_runs, src, ctl.name, run_dir)
                else:
                    log.info("resume: %s runs again: its control beside it (%s) %s", name, ctl.name,
                             "ran elsewhere than its control here" if ctl_runs else "did not finish")
                    earlier = None
            if earlier:
                arm.runs = take_rung(earlier, src, name, run_dir)
                read_back.add(name)
            elif ctl is not None:  # control first, then the rung; BA on the next repeat
                # the control's own answers stand for the run beside it only where they were computed here
                ctl.score_quality = bool(across_runs(prev.environments, [environment()]))
                try:
                    if switchback:
                        stop = sequential_stop(gate, ladder.looks, ctl.name, arm.name)[1]
                        looks_made[name] = run_switchback([ctl, arm], ladder.blocks, run_dir, parent.run_id,
                                                          progress=bool(cfg.replay.progress), looks=ladder.looks,
                                                          stop=stop)
                    else:
                        run_arms([ctl, arm], ladder.repeats, run_dir, parent.run_id)
                except Exception as e:
                    if switchback:  # both arms load before either replays: the error says which
                        raise
                    order = [x for r in range(ladder.repeats) for x in ((ctl, arm) if r % 2 == 0 else (arm, ctl))]
                    i = len(ctl.runs) + len(arm.runs)  # the run that raised; its type kept where it ends the ladder
                    if i < len(order) and order[i] is ctl and not ladder.stop_on_error:
                        raise RuntimeError(f"its control run beside it ({ctl.name}) raised: {type(e).__name__}: "
                                           f"{str(e).strip()}") from e
                    raise
            else:
                if prev is not None and prev.name in read_back:
                    control_here(prev, name)  # before the rung: a deadline that cuts it leaves no rung judged
                run_arms([arm], ladder.repeats, run_dir, parent.run_id)
            first_runs.append(arm.runs[0])
            return arm

        def control_here(prev: Arm, name: str) -> None:
            """Run `prev` (read back) again on this machine as `name`'s control, when ladder.rerun_control says
            so: its environment differs from this one (differs), or always; unless a run of it here exists."""
            now = [environment()]
            diffs = across_runs(prev.environments, now)
            if ladder.rerun_control == "never" or (ladder.rerun_control == "differs" and not diffs):
                return
            if prev.name in failed or any(not across_runs(a.environments, now) for a in again.get(prev.name, [])):
                return
            why = describe(diffs) if diffs else "ladder.rerun_control=always"
            print(f"{prev.name} was read back from another run ({why}): running it again here as {name}'s control")
            arm = Arm(f"{prev.name}{RERUN}-{name}", prev.overrides, prev.cfg, [], prev.prepared)
            try:
                run_arms([arm], ladder.repeats, run_dir, parent.run_id)
            except Exception as e:  # noqa: BLE001 - the read-back control still stands; its verdict says why
                raise_if_terminated(e)
                if ladder.stop_on_error:
                    raise
                log.error("%s failed, %s is judged against the read-back runs: %s: %s", arm.name, name,
                          type(e).__name__, str(e).strip()[:300])
                del e
                failed.add(prev.name)
                free_device_memory()
                return
            again.setdefault(prev.name, []).append(arm)

        def judge(prev: Arm, cand: Arm) -> tuple[Verdict, ArmResult]:
            if cand.name in beside:
                ctl = beside[cand.name]
                if not ladder.pool_noise or ladder.design == "switchback":  # blocks measure their own noise
                    return gate_pair(with_answers(ctl, prev), cand, gate, latency_alpha=lat_alpha)[:2]
                # an A/A pair: the control's own run and its run beside the rung, made one after the other in one
                # environment (not where one of them was read back from an earlier run and the other made here)
                same_run = (prev.name in read_back) == (cand.name in read_back)
                for own, run in zip(prev.runs, ctl.runs):
                    envs = ([own.snapshot.get("environment") or {}], [run.snapshot.get("environment") or {}])
                    if not same_run or str(own.run_dir) in paired or across_runs(*envs):
                        continue  # a control's own run pairs once: two pairs sharing it are not independent
                    d = {metric: aa_log_ratio(metric, own.records, run.records) for metric in gate.run_noise}
                    if d and None not in d.values():
                        paired.add(str(own.run_dir))
                        for metric, x in d.items():
                            aa.setdefault(metric, []).append(x)
                pooled_gate, pooled[cand.name] = pooled_run_noise(gate, aa)
                return gate_pair(with_answers(ctl, prev), cand, pooled_gate)[:2]
            if prev.name in read_back:
                prev = control_for(prev, cand)
            return gate_pair(prev, cand, gate)[:2]

        def control_for(prev: Arm, cand: Arm) -> Arm:
            """The runs of `prev` (read back) that `cand` is judged against: the first of prev, its runs again
            here, and its runs again by an earlier resume (copied here only then) that ran in cand's
            environment; prev where none did (the verdict then says so)."""
            for alt in (prev, *again.get(prev.name, [])):
                if not across_runs(alt.environments, cand.environments):
                    return alt
            alt = earlier_again(prev, cand)
            if alt is not None:
                again.setdefault(prev.name, []).append(alt)
            return alt or prev

        def earlier_again(prev: Arm, cand: Arm) -> Arm | None:
            if not ladder.resume_from:
                return None
            for d in sorted(Path(ladder.resume_from).glob(f"{prev.name}{RERUN}-*-r0")):
                snap = d / SNAPSHOT_FILE  # its environment first: the runs are read (and copied) only on a match
                env = json.loads(snap.read_text()).get("environment") or {} if snap.is_file() else {}
                if env and not across_runs([env], cand.environments):
                    name = d.name[:-len("-r0")]
                    runs = resume_rung(Path(ladder.resume_from), name, ladder.repeats, prev.resolved, digests,
                                       run_dir)
                    if runs:
                        return Arm(name, prev.overrides, prev.cfg, runs, prev.prepared)
            return None

        def write(rungs: list[dict], accepted: list[str], complete: bool) -> str:
            """ladder.json and ladder.md as they stand: after every rung (complete false: a ladder cut by a
            deadline, a crash or a lost machine keeps the verdicts it reached), and once more at the end."""
            for row in rungs:  # what each rung's latency was gated against: its control's run beside it
                name = f"rung{row['rung']}-{row['opt']}" if row["rung"] else "rung0-baseline"
                ctl = beside.get(name)
                if ctl is not None and ctl.runs:
                    row["control_beside"] = {"name": ctl.name, "run_ids": [r.run_id for r in ctl.runs],
                                             "metrics": ctl.runs[0].metrics}
                if pooled.get(name):  # gate.run_noise as its latency gates used it
                    row["run_noise_pooled"] = pooled[name]
                if ladder.design == "switchback" and row["rung"] and row["status"] != "error":
                    runs = [r for r in first_runs if Path(r.run_dir).name == f"{name}-r0"]
                    row["blocks"] = ladder.blocks
                    row["blocks_played"] = len(runs[0].blocks) if runs and runs[0].blocks else None
                    row["looks"] = looks_made.get(name, [])  # empty for a rung read back from resume_from
                    row["latency_alpha"] = lat_alpha or gate.alpha
            table = ladder_table(rungs)
            if not complete:
                table = (f"**Incomplete: {len(rungs) - 1} of {len(ladder.rungs)} rungs done** (ladder.json "
                         f"`complete: false`: written after each rung, while the ladder ran or where it was cut "
                         f"short)\n\n"
                         + table)
            # each file whole or not at all (a SIGTERM lands between any two instructions): ladder.md first, so a
            # ladder.json that is there has its table beside it
            replace_file(run_dir / "ladder.md", table + "\n")
            replace_file(run_dir / "ladder.json", json.dumps({"ladder": ladder.name, "rungs": rungs,
                                                              "accepted": accepted, "complete": complete,
                                                              "planned": list(ladder.rungs)}, indent=2, default=str))
            return table

        def write_so_far(rows: list[dict], acc: list[str]) -> None:
            try:
                write(rows, acc, False)
            except Exception as e:  # noqa: BLE001 - a report that cannot be written must not end the ladder
                raise_if_terminated(e)
                log.warning("ladder.json / ladder.md after rung %d not written: %s: %s", rows[-1]["rung"],
                            type(e).__name__, e)

        rungs, accepted = climb(ladder.rungs, ladder.keep_inconclusive, run_rung, judge, ladder.stop_on_error,
                                on_row=write_so_far)
        table = write(rungs, accepted, True)
        ladder_chart(rungs, run_dir / "ladder.png")
        write_load_curves({f"rung {i}: {'+'.join(r.opts) or 'baseline'}": r.load_levels
                           for i, r in enumerate(first_runs) if r.load_levels}, run_dir)
        print(table)
        print(f"ladder.json, ladder.md, ladder.png in {run_dir}")
        return 0


def replace_file(path: Path, text: str) -> None:
    """path's content becomes text in one step (a temporary file beside it, then os.replace)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


RERUN = "-here"  # a read-back rung run again on this machine as a later rung's control: <rung>-here-<later rung>-r0
AGAIN = "-again"  # ladder.interleave: a rung's control run beside it: <control>-again-<rung>-r<k>


def with_answers(beside: Arm, control: Arm) -> Arm:
    """The control a rung is gated against under ladder.interleave: the runs made beside the rung (its latency,
    its environment), with the greedy answers and their scores of the control's own run (the run beside it
    scored none: greedy answers do not depend on when they are computed, the replay's timing does); the run
    beside it as it is where it scored its own (the control's own run was made in another environment)."""
    if beside.runs[0].outputs:
        return beside
    own = control.runs[0]
    scores = {k: v for k, v in own.metrics.items() if k.startswith("quality/")}
    first = replace(beside.runs[0], outputs=own.outputs, quality_per_prompt=own.quality_per_prompt,
                    metrics={**beside.runs[0].metrics, **scores}, traces=own.traces,
                    traces_unavailable=own.traces_unavailable)
    return Arm(beside.name, beside.overrides, beside.cfg, [first, *beside.runs[1:]], control.prepared)


def climb(opts: list[str], keep_inconclusive: bool, run_rung: RunRung, judge: Judge,
          stop_on_error: bool = False, on_row: OnRow | None = None) -> tuple[list[dict], list[str]]:
    """The baseline, then one rung per opt: the accepted opts plus this one, judged against the last
    accepted rung. Returns one row per rung (ladder.json's) and the opts accepted at the end. A rung whose
    run raises (a CUDA out-of-memory, a crash) is left out with status `error` and its reason, and the
    ladder goes on, unless stop_on_error; the baseline's error always ends it (nothing to judge against).
    on_row(rows so far, accepted so far): called after every row (the baseline's too), e.g. to write them."""
    on_row = on_row or (lambda rows, acc: None)
    prev = base = run_rung("rung0-baseline", [], None)
    rungs = [{"rung": 0, "opt": None, "opts": [], "status": "baseline", "accepted_rung": 0,
              "metrics": prev.runs[0].metrics, "run_id": prev.runs[0].run_id}]
    accepted: list[str] = []
    on_row(rungs, [])
    accepted_rung = 0
    for i, opt in enumerate(opts, 1):
        on = rung_opts(accepted, opt)
        try:
            cand = run_rung(f"rung{i}-{opt}", on, prev)
        except Exception as e:  # noqa: BLE001 - what a rung hit is its row's reason; KeyboardInterrupt still ends it
            raise_if_terminated(e)  # a SIGTERM that a library turned into its own error
            if stop_on_error:
                raise
            reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]
            del e
            free_device_memory()  # an out-of-memory rung must not leave its tensors to the next one
            print(f"rung {i} (+{opt}) vs rung {accepted_rung}: ERROR, left out: {reason}")
            rungs.append({"rung": i, "opt": opt, "opts": on, "status": "error", "kept": False,
                          "accepted_rung": accepted_rung, "metrics": {}, "run_id": None, "reason": reason})
            on_row(rungs, list(accepted))
            continue
        verdict, cres = judge(prev, cand)
        print(f"rung {i} (+{opt}) vs rung {accepted_rung}:\n{verdict_table(verdict)}")
        keep = keeps(verdict.status, keep_inconclusive)
        if keep:
            accepted, prev, accepted_rung = on, cand, i
        rungs.append({"rung": i, "opt": opt, "opts": on, "status": verdict.status, "kept": keep,
                      "accepted_rung": accepted_rung, "metrics": cres.metrics,
                      "run_id": cand.runs[0].run_id, "verdict": verdict.to_dict(),
                      # against the baseline, whose numbers the headline compares this rung's with
                      "environment_vs_baseline": differences(base.environments[0], cand.environments[0])})
        on_row(rungs, list(accepted))
    return rungs, accepted
