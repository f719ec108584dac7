"""Run a ladder: the baseline, then one more opt per rung, each rung gated against the last accepted one
(abtest/ladder.py decides which opts a rung runs and whether it is kept). Writes ladder.json, ladder.md and
ladder.png (and with replay.load_levels the load curves and Pareto frontier of the rungs), in one MLflow
parent run with a child run per rung."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from abtest.ladder import keeps, ladder_chart, ladder_table, rung_opts
from abtest.verdict import verdict_table
from experiments.ab_run import (Arm, base_overrides, check_rung_engines, compose_arm, gate_config, gate_pair,
                                prepare_arms, run_arms)
from experiments.load_curves import write_load_curves
from experiments.tracking import Tracker


def run_ladder(cfg: DictConfig, run_dir: Path, overrides: list[str], choices: dict) -> int:
    ladder = OmegaConf.to_object(cfg.ladder)
    base = base_overrides(overrides)
    gate = gate_config(cfg)
    prev = Arm("rung0-baseline", list(base), compose_arm(base, []), [])
    prepare_arms([prev])  # the rungs differ in opts only: they replay and score the baseline's data
    check_rung_engines([compose_arm(base, [f"+opt=[{','.join(ladder.rungs[:i])}]"])
                        for i in range(1, len(ladder.rungs) + 1)])
    parent = Tracker(OmegaConf.to_object(cfg.tracking), f"ladder:{ladder.name}",
                     {"optladder.kind": "ladder", "ladder": ladder.name})
    ok = False
    try:
        run_arms([prev], ladder.repeats, run_dir, parent.run_id)
        first_runs = [prev.runs[0]]
        rungs = [{"rung": 0, "opt": None, "opts": [], "status": "baseline", "accepted_rung": 0,
                  "metrics": prev.runs[0].metrics, "run_id": prev.runs[0].run_id}]
        accepted: list[str] = []
        accepted_rung = 0
        for i, opt in enumerate(ladder.rungs, 1):
            opts = rung_opts(accepted, opt)
            extra = [f"+opt=[{','.join(opts)}]"]
            cand = Arm(f"rung{i}-{opt}", [*base, *extra], compose_arm(base, extra), [], prev.prepared)
            run_arms([cand], ladder.repeats, run_dir, parent.run_id)
            first_runs.append(cand.runs[0])
            verdict, cres, _, _ = gate_pair(prev, cand, gate)
            print(f"rung {i} (+{opt}) vs rung {accepted_rung}:\n{verdict_table(verdict)}")
            keep = keeps(verdict.status, ladder.keep_inconclusive)
            if keep:
                accepted = opts
                prev, accepted_rung = cand, i
            rungs.append({"rung": i, "opt": opt, "opts": opts, "status": verdict.status, "kept": keep,
                          "accepted_rung": accepted_rung, "metrics": cres.metrics,
                          "run_id": cand.runs[0].run_id, "verdict": verdict.to_dict()})
        table = ladder_table(rungs)
        (run_dir / "ladder.json").write_text(json.dumps({"ladder": ladder.name, "rungs": rungs,
                                                         "accepted": accepted}, indent=2, default=str))
        (run_dir / "ladder.md").write_text(table + "\n")
        ladder_chart(rungs, run_dir / "ladder.png")
        write_load_curves({f"rung {i}: {'+'.join(r.opts) or 'baseline'}": r.load_levels
                           for i, r in enumerate(first_runs) if r.load_levels}, run_dir)
        print(table)
        print(f"ladder.json, ladder.md, ladder.png in {run_dir}")
        ok = True
        return 0
    finally:
        parent.log_artifacts(run_dir)
        parent.end(ok)
