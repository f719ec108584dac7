"""The `optladder` command. Its experiment subcommands are one Hydra app, the one run.py starts too:

    optladder run [overrides]              one experiment: the baseline on the default model (python run.py)
    optladder run +opt=flash_attn          the same with one optimization on; '+opt=[paged_kv,flash_attn]': several
    optladder sweep '+opt=glob(*)'         a sweep: one MLflow parent run, a child run per job (python run.py -m)
    optladder ab batched_decode            control vs candidate, gated: exit 0 pass, 1 fail, 2 inconclusive
    optladder ladder seed                  one more opt per rung, each gated against the one before
    optladder soak cpu                     a bounded replay in a loop, with memory, leak and p99.9 gates

and the tools around them: compare, diff, plan, rollback, summary, import-runs, export-runs, mlflow-server,
bench (`optladder --help`). A bad config or bad data prints one line, `optladder: error: ...`, and exits 3
(optladder/experiments/errors.py); --verbose (or HYDRA_FULL_ERROR=1) shows the traceback instead.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig

from optladder.experiments import lifecycle, tracking
from optladder.experiments.build import check_keys
from optladder.experiments.errors import PREFIX, USER_ERROR_EXIT, UserError, as_user_error, one_line
from optladder.experiments.schema import register
from optladder.paths import conf_options

register()
log = logging.getLogger("optladder")
# Hydra drops the task's return value: an A/B's verdict, or how a run ended (optladder/experiments/lifecycle.py),
# is the process's exit status
_exit: list[int | None] = [None]
_verbose = [False]  # --verbose or HYDRA_FULL_ERROR=1: a user error shows its traceback


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
def app(cfg: DictConfig) -> int:
    """The Hydra app: one experiment, A/B, ladder or soak, or one job of a sweep."""
    try:
        try:
            return _main(cfg)
        except Exception as e:  # a SIGTERM whose exception a library lost on its way up: still that SIGTERM (a
            lifecycle.raise_if_terminated(e)  # sweep stops too: Hydra goes on only past an Exception)
            raise
    except tracking.TrackingUnreachable as e:  # nothing ran: one clear line, no traceback
        log.error("%s", e)
        _exit[0] = lifecycle.EXIT_TRACKING
        return _exit[0]
    except BaseException as e:
        _exit[0] = lifecycle.exit_status(e)
        raise


def _main(cfg: DictConfig) -> int:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    try:
        with as_user_error():
            check_keys(cfg)  # a `+engine.typo=...` override would otherwise be dropped without a word
        code = _run(cfg, hc, run_dir)
        if _exit[0] != USER_ERROR_EXIT:  # a sweep whose job met a user error says so at the end
            _exit[0] = code
    except UserError as e:
        # caught here, not left to Hydra: it would add its own lines, and a sweep goes on with its next job
        lifecycle.raise_if_terminated(e)  # a lost SIGTERM (Hydra's composition) is no user error
        if _verbose[0]:
            raise
        job = f"[job {hc.job.num}: {' '.join(hc.overrides.task)}] " if hc.mode == RunMode.MULTIRUN else ""
        print(f"{PREFIX}{job}{e}", file=sys.stderr)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(f"{e}\n")
        _exit[0] = USER_ERROR_EXIT
    return _exit[0]


def _run(cfg: DictConfig, hc, run_dir: Path) -> int:
    overrides = list(hc.overrides.task)
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")}
    if cfg.soak is not None:
        from optladder.experiments.soak_run import run_soak

        return run_soak(cfg, run_dir, overrides, choices)
    if cfg.ab is not None or cfg.ladder is not None:
        from optladder.experiments.ab_run import run_ab
        from optladder.experiments.ladder_run import run_ladder

        runner = run_ab if cfg.ab is not None else run_ladder
        return runner(cfg, run_dir, overrides, choices)
    from optladder.experiments.experiment import run_experiment
    from optladder.experiments.report import footer, results_table

    tags: dict[str, str] = {}
    if hc.mode == RunMode.MULTIRUN:
        from optladder.experiments.sweep import sweep_job

        tags = sweep_job(cfg, run_dir, overrides)
        if tags is None:  # skipped, and recorded as such
            return 0
    result = run_experiment(cfg, run_dir, overrides, choices, tags=tags)
    print()
    print(results_table(result.metrics, f"optladder: {', '.join(result.opts) or 'baseline'} on {cfg.model.name}"))
    print(footer(result.run_id, run_dir, cfg.tracking))
    return 0


def exit_code(hydra_code: int | str | None) -> int:
    """The process's exit status: how the run ended if it got that far, else what Hydra said (a config error)."""
    if tracking.LOST and _exit[0] in (None, 0, 1, 2):  # the run finished locally but MLflow lost it
        log.error("MLflow lost this run mid-way (%s): its results are in the run directory only", tracking.LOST[0])
        return lifecycle.EXIT_TRACKING
    if _exit[0] is not None:
        return _exit[0]
    return hydra_code if isinstance(hydra_code, int) else (0 if hydra_code is None else 1)


def cli() -> None:
    from optladder.experiments.callbacks import finish_active_sweep

    argv = quote_arm_overrides(sys.argv)
    _verbose[0] = "--verbose" in argv or os.environ.get("HYDRA_FULL_ERROR") == "1"
    sys.argv = [a for a in argv if a != "--verbose"]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises what it catches; what the user sees is decided here
    lifecycle.install_signal_handlers()  # SIGTERM unwinds like Ctrl-C: records kept, servers stopped, KILLED
    code: int | str | None = None
    try:
        try:
            app()
        except Exception as e:  # a SIGTERM that a library turned into its own error on its way up: still a SIGTERM
            lifecycle.raise_if_terminated(e)
            raise
    except (UserError, CompactHydraException) as e:  # a config that does not compose is a user error too
        finish_active_sweep()
        if _verbose[0]:
            raise
        print(PREFIX + one_line(e), file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    except SystemExit as e:  # a sweep stopped before its jobs (its tracking store unreachable), or Hydra's own
        finish_active_sweep()
        code = e.code
    except (KeyboardInterrupt, lifecycle.Terminated) as e:
        finish_active_sweep()
        _exit[0] = lifecycle.exit_status(e)
        log.error("stopped by %s: what finished is on disk, the MLflow run is KILLED",
                  "SIGINT" if isinstance(e, KeyboardInterrupt) else f"signal {e.signum}")
        # everything is on disk and every run ended: leave now, without the interpreter's teardown, which can
        # abort (SIGABRT) on a replay or torch worker thread cut short mid-operation by the signal
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code(None))
    except BaseException:  # a crash: its traceback, then the exit status of lifecycle.py (70)
        finish_active_sweep()
        traceback.print_exc()
    sys.exit(exit_code(code))


# subcommand -> (what it does, how its arguments reach the Hydra app)
HYDRA_COMMANDS = {
    "run": ("one experiment (Hydra overrides follow)", lambda a: a),
    "sweep": ("a multirun sweep: one MLflow parent, a child run per job", lambda a: ["-m", *a]),
    "ab": ("NAME [overrides]: control vs candidate of conf/ab/NAME.yaml, gated", lambda a: _group("ab", a)),
    "ladder": ("NAME [overrides]: the ladder of conf/ladder/NAME.yaml", lambda a: _group("ladder", a)),
    "soak": ("NAME [overrides]: the bounded soak of conf/soak/NAME.yaml", lambda a: _group("soak", a)),
}
# subcommand -> (what it does, module, leading arguments): each module's main(argv) parses the rest
TOOLS = {
    "compare": ("two ladders against each other (reproduced or not)", "optladder.experiments.ladder_compare", []),
    "diff": ("two runs' config snapshots, key by key", "optladder.experiments.diff", []),
    "plan": ("the KV plan of a config before anything loads", "optladder.experiments.plan", []),
    "rollback": ("the rollout registry: roll an opt back", "optladder.abtest.rollback", []),
    "summary": ("A/B verdicts of a folder as one table", "optladder.experiments.ab_summary", []),
    "import-runs": ("MLflow runs exported elsewhere into a store", "optladder.experiments.runs_transfer", ["import"]),
    "export-runs": ("a store's MLflow runs as files", "optladder.experiments.runs_transfer", ["export"]),
    "mlflow-server": ("one MLflow tracking server for every job", "optladder.experiments.tracking_server", []),
    "bench": ("measurements: latency | switches (optladder bench --help)", "optladder.bench", []),
}


def _group(group: str, args: list[str]) -> list[str]:
    if not args or args[0].startswith(("-", "+")) or "=" in args[0]:
        print(f"{PREFIX}optladder {group} needs a NAME first, one of {conf_options(group)}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    return [f"+{group}={args[0]}", *args[1:]]


def usage() -> str:
    rows = [*((k, v[0]) for k, v in HYDRA_COMMANDS.items()), *((k, v[0]) for k, v in TOOLS.items())]
    return "usage: optladder COMMAND [args]\n\n" + "\n".join(f"  {k:<14} {h}" for k, h in rows) + \
        "\n\nrun, sweep, ab, ladder and soak take Hydra overrides (docs/design.md); the others --help."


def main(argv: list[str] | None = None) -> None:
    """The console script `optladder`."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0 if args else 2)
    cmd, rest = args[0], args[1:]
    if cmd in HYDRA_COMMANDS:
        sys.argv = ["optladder", *HYDRA_COMMANDS[cmd][1](rest)]
        cli()
    if cmd in TOOLS:
        import importlib

        _, module, lead = TOOLS[cmd]
        sys.argv = [f"optladder {cmd}", *rest]  # argparse's usage line names the subcommand
        sys.exit(importlib.import_module(module).main([*lead, *rest]) or 0)
    print(f"{PREFIX}unknown command {cmd!r}; valid: {sorted([*HYDRA_COMMANDS, *TOOLS])}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
