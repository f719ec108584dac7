"""How a run ends: its MLflow status and the process's exit status, from what stopped it.

| what happened | MLflow status | exit status |
|---|---|---|
| finished (an A/B: its verdict) | FINISHED | 0 (A/B: 0 pass, 1 fail, 2 inconclusive) |
| the engine or the run raised | FAILED | 70 (EX_SOFTWARE) |
| SIGINT (Ctrl-C) / SIGTERM | KILLED | 130 / 143 (128 + the signal) |
| the MLflow store unreachable at start (nothing was run) or lost mid-run (the run finished locally) | - | 69 (EX_UNAVAILABLE) |

SIGTERM becomes an exception in the main thread (backends.launcher.Terminated), like SIGINT's
KeyboardInterrupt, so every `finally` runs: records already on disk stay, child servers and the locust
worker are stopped, and the MLflow run is ended with the status above. A SIGTERM whose exception a library lost on
its way up (terminated()) still ends the run as one: 143, KILLED.
"""
from __future__ import annotations

from optladder.backends.launcher import Terminated, install_signal_handlers, raise_if_terminated, terminated
from optladder.experiments.tracking import TrackingUnreachable, run_status

EXIT_CRASHED = 70
EXIT_TRACKING = 69

__all__ = ["EXIT_CRASHED", "EXIT_TRACKING", "Terminated", "exit_status", "install_signal_handlers",
           "raise_if_terminated", "run_status", "terminated"]


def exit_status(exc: BaseException) -> int:
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, Terminated):
        return 128 + exc.signum
    if isinstance(exc, TrackingUnreachable):
        return EXIT_TRACKING
    return EXIT_CRASHED
