"""optladder's one entry point.

    python run.py                                one experiment: the baseline on the default model
    python run.py +opt=flash_attn                the same with one optimization on
    python run.py '+opt=[paged_kv,flash_attn]'   several
    python run.py -m '+opt=glob(*)'              a sweep: one MLflow parent run, a child run per job
    python run.py +ab=batched_decode             control vs candidate, gated: exit 0 pass, 1 fail, 2 inconclusive
    python run.py +ladder=seed                   one more opt per rung, each gated against the one before
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.schema import register

register()
log = logging.getLogger("optladder")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")}
    if cfg.ab is not None or cfg.ladder is not None:
        from abtest.orchestrate import run_ab, run_ladder

        runner = run_ab if cfg.ab is not None else run_ladder
        return runner(cfg, run_dir, overrides, choices)
    from experiments.experiment import run_experiment
    from experiments.report import footer, results_table

    result = run_experiment(cfg, run_dir, overrides, choices)
    print()
    print(results_table(result.metrics, f"optladder: {', '.join(result.opts) or 'baseline'} on {cfg.model.name}"))
    print(footer(result.run_id, run_dir, cfg.tracking))
    return 0


if __name__ == "__main__":
    code = main()
    sys.exit(code if isinstance(code, int) else 0)
