"""Test-only faults injected into the reference engine's step, so the gates' power and a run's failure
handling can be checked against a known cause. Never set them for a measurement you mean to keep.

    python run.py +ab=aa 'ab.candidate=[faults.step_slowdown=0.15]'   # a candidate 15% slower per step
    python run.py faults.fail_after_steps=40                          # the engine dies mid-replay

Only the replay path is affected (the in-process driver and the HTTP server step through this wrapper);
quality generation and the warm-up call the engine directly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional


@dataclass
class FaultConfig:
    # after each engine step, sleep this fraction of the step's own duration: 0.15 makes every step 15% slower
    step_slowdown: float = 0.0
    # the step after this many replay steps raises RuntimeError, as a device error mid-replay would
    fail_after_steps: Optional[int] = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.step_slowdown <= 10.0:
            raise ValueError(f"faults.step_slowdown must be in [0, 10] (a fraction of each step's time), "
                             f"got {self.step_slowdown}")
        if self.fail_after_steps is not None and self.fail_after_steps < 0:
            raise ValueError(f"faults.fail_after_steps must be >= 0 or null, got {self.fail_after_steps}")

    @property
    def any(self) -> bool:
        return self.step_slowdown > 0 or self.fail_after_steps is not None


class InjectedFault(RuntimeError):
    """The engine failure that faults.fail_after_steps asked for."""


class FaultyEngine:
    """An engine whose `step` carries the configured faults; everything else is the engine's own."""

    def __init__(self, engine, faults: FaultConfig):
        self.engine, self.faults = engine, faults
        self.steps = 0

    def step(self):
        f = self.faults
        if f.fail_after_steps is not None and self.steps >= f.fail_after_steps:
            raise InjectedFault(f"injected engine failure after {self.steps} steps (faults.fail_after_steps)")
        self.steps += 1
        t0 = time.perf_counter()
        events = self.engine.step()
        if f.step_slowdown > 0:
            time.sleep(f.step_slowdown * (time.perf_counter() - t0))
        return events

    def __getattr__(self, name):
        return getattr(self.engine, name)
