"""optladder's one entry point.

    python run.py                                one experiment: the baseline on the default model
    python run.py +opt=flash_attn                the same with one optimization on
    python run.py '+opt=[paged_kv,flash_attn]'   several
    python run.py -m '+opt=glob(*)'              a sweep: one MLflow parent run, a child run per job
    python run.py +ab=batched_decode             control vs candidate, gated: exit 0 pass, 1 fail, 2 inconclusive
    python run.py +ladder=seed                   one more opt per rung, each gated against the one before
    python run.py +soak=cpu                      a bounded replay in a loop, with memory, leak and p99.9 gates
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments import lifecycle, tracking
from experiments.build import check_keys
from experiments.schema import register

register()
log = logging.getLogger("optladder")
# Hydra drops the task's return value: an A/B's verdict, or how a run ended (experiments/lifecycle.py),
# is the process's exit status
_exit: list[int | None] = [None]


ARM_KEYS = ("ab.control=", "ab.candidate=", "+ab.control=", "+ab.candidate=")


def quote_arm_overrides(argv: list[str]) -> list[str]:
    """Let `ab.candidate=[+opt=x,engine.dtype=bfloat16]` through Hydra's grammar, which wants each element
    of such a list quoted: split at top-level commas and quote every element not quoted yet."""
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if not arg.startswith(ARM_KEYS) or not (value.startswith("[") and value.endswith("]")):
            out.append(arg)
            continue
        items, depth, cur = [], 0, ""
        for ch in value[1:-1]:
            depth += (ch == "[") - (ch == "]")
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        items = [i.strip() for i in [*items, cur] if i.strip()]
        quoted = [i if i[0] in "'\"" else "'" + i + "'" for i in items]
        out.append(f"{key}=[{','.join(quoted)}]")
    return out


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    try:
        return _main(cfg)
    except tracking.TrackingUnreachable as e:  # nothing ran: one clear line, no traceback
        log.error("%s", e)
        _exit[0] = lifecycle.EXIT_TRACKING
        return _exit[0]
    except BaseException as e:
        _exit[0] = lifecycle.exit_status(e)
        raise


def _main(cfg: DictConfig) -> int:
    check_keys(cfg)  # a `+engine.typo=...` override would otherwise be dropped without a word
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")}
    if cfg.soak is not None:
        from experiments.soak_run import run_soak

        _exit[0] = run_soak(cfg, run_dir, overrides, choices)
        return _exit[0]
    if cfg.ab is not None or cfg.ladder is not None:
        from experiments.ab_run import run_ab
        from experiments.ladder_run import run_ladder

        runner = run_ab if cfg.ab is not None else run_ladder
        _exit[0] = runner(cfg, run_dir, overrides, choices)
        return _exit[0]
    from experiments.experiment import run_experiment
    from experiments.report import footer, results_table

    result = run_experiment(cfg, run_dir, overrides, choices)
    print()
    print(results_table(result.metrics, f"optladder: {', '.join(result.opts) or 'baseline'} on {cfg.model.name}"))
    print(footer(result.run_id, run_dir, cfg.tracking))
    _exit[0] = 0
    return 0


def exit_code(hydra_code: int | str | None) -> int:
    """The process's exit status: how the run ended if it got that far, else what Hydra said (a config error)."""
    if tracking.LOST and _exit[0] in (None, 0, 1, 2):  # the run finished locally but MLflow lost it
        log.error("MLflow lost this run mid-way (%s): its results are in the run directory only", tracking.LOST[0])
        return lifecycle.EXIT_TRACKING
    if _exit[0] is not None:
        return _exit[0]
    return hydra_code if isinstance(hydra_code, int) else (0 if hydra_code is None else 1)


if __name__ == "__main__":
    sys.argv = quote_arm_overrides(sys.argv)
    lifecycle.install_signal_handlers()  # SIGTERM unwinds like Ctrl-C: records kept, servers stopped, KILLED
    try:
        main()
        code = None
    except SystemExit as e:  # Hydra reports a job's exception (or a config error) and exits 1
        code = e.code
    except (KeyboardInterrupt, lifecycle.Terminated) as e:
        _exit[0] = lifecycle.exit_status(e)
        log.error("stopped by %s: what finished is on disk, the MLflow run is KILLED",
                  "SIGINT" if isinstance(e, KeyboardInterrupt) else f"signal {e.signum}")
        code = None
    sys.exit(exit_code(code))
