"""Run a ladder: the baseline, then one more opt per rung, each rung gated against the last accepted one
(abtest/ladder.py decides which opts a rung runs and whether it is kept). Writes ladder.json, ladder.md and
ladder.png, in one MLflow parent run with a child run per rung."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from abtest.ladder import keeps, ladder_chart, ladder_table, rung_opts
from abtest.verdict import verdict_table
from experiments.ab_run import Arm, base_overrides, compose_arm, gate_config, gate_pair, run_arms
from experiments.lifecycle import run_status
from experiments.tracking import Tracker


def run_ladder(cfg: DictConfig, run_dir: Path, overrides: list[str], choices: dict) -> int:
    ladder = OmegaConf.to_object(cfg.ladder)
    base = base_overrides(overrides)
    gate = gate_config(cfg)
    parent = Tracker(OmegaConf.to_object(cfg.tracking), f"ladder:{ladder.name}",
                     {"optladder.kind": "ladder", "ladder": ladder.name})
    status = "FAILED"
    try:
        prev = Arm("rung0-baseline", list(base), compose_arm(base, []), [])
        run_arms([prev], ladder.repeats, run_dir, parent.run_id)
        rungs = [{"rung": 0, "opt": None, "opts": [], "status": "baseline", "accepted_rung": 0,
                  "metrics": prev.runs[0].metrics, "run_id": prev.runs[0].run_id}]
        accepted: list[str] = []
        accepted_rung = 0
        for i, opt in enumerate(ladder.rungs, 1):
            opts = rung_opts(accepted, opt)
            extra = [f"+opt=[{','.join(opts)}]"]
            cand = Arm(f"rung{i}-{opt}", [*base, *extra], compose_arm(base, extra), [])
            run_arms([cand], ladder.repeats, run_dir, parent.run_id)
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
        print(table)
        print(f"ladder.json, ladder.md, ladder.png in {run_dir}")
        status = "FINISHED"
        return 0
    except BaseException as e:
        status = run_status(e)
        raise
    finally:
        parent.log_artifacts(run_dir)
        parent.end(status)
