"""Where did the time go: a torch profiler trace of `steps` engine steps in the middle of a replay.

`+profile=torch` wraps the in-process engine the replay driver steps (the engine's own loop is left as it
is): once half of the replay's requests have been added, the next `steps` steps that do work are recorded,
each engine stage (schedule, prefill, decode, sample, detokenize) as a named range. Written to the run
directory, hence to MLflow: `profile_trace.json` (Chrome trace format: chrome://tracing or
https://ui.perfetto.dev) and `profile_ops.md`, the top ops of each stage by self time.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

log = logging.getLogger(__name__)
PROFILERS = ("torch",)
TRACE_FILE, OPS_FILE = "profile_trace.json", "profile_ops.md"
RANGE, STEP = "stage/", "engine_step"


@dataclass
class ProfileConfig:
    name: str = "torch"
    steps: int = 20  # engine steps recorded; a SmolLM2 step on a CPU is a few hundred KB of trace
    top_ops: int = 12  # rows per stage in profile_ops.md
    record_shapes: bool = False  # input shapes per op: a larger trace, ops split by shape

    def __post_init__(self) -> None:
        if self.name not in PROFILERS:
            raise ValueError(f"profile.name={self.name!r} is not one of {list(PROFILERS)}")
        for key in ("steps", "top_ops"):
            if getattr(self, key) < 1:
                raise ValueError(f"profile.{key} must be >= 1, got {getattr(self, key)}")


class _RangedTimers:
    """The engine's stage timers, each stage also a profiler range: the ops inside it are attributed to it."""

    def __init__(self, timers):
        self._timers = timers

    def __getattr__(self, name):
        return getattr(self._timers, name)

    @contextmanager
    def time(self, stage: str, sync=None):
        with record_function(RANGE + stage), self._timers.time(stage, sync):
            yield


class ProfiledEngine:
    """A StepEngine (traffic.replay) that records `cfg.steps` working steps once `start_after` requests
    were added, then writes the trace and the table into out_dir."""

    def __init__(self, engine, cfg: ProfileConfig, start_after: int, out_dir: Path):
        self.engine, self.cfg, self.out_dir = engine, cfg, Path(out_dir)
        self.start_after = max(1, start_after)
        self.added, self.recorded = 0, 0
        self._prof: profile | None = None
        self.done = False

    def add_request(self, *args, **kwargs):
        self.added += 1
        return self.engine.add_request(*args, **kwargs)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def next_deadline(self):
        return self.engine.next_deadline()

    def step(self) -> list:
        if self.done or self.added < self.start_after:
            return self.engine.step()
        if self._prof is None:
            self._start()
        with record_function(STEP):
            events = self.engine.step()
        self.recorded += bool(events)
        if self.recorded >= self.cfg.steps:
            self.finish()
        return events

    def _start(self) -> None:
        cuda = torch.cuda.is_available() and getattr(self.engine, "device", torch.device("cpu")).type == "cuda"
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self._prof = profile(activities=acts, record_shapes=self.cfg.record_shapes)
        if hasattr(self.engine, "timers"):
            self.engine.timers = _RangedTimers(self.engine.timers)
        self._prof.start()

    def finish(self) -> None:
        """Stop and write; also called when the replay ends before `steps` steps were recorded."""
        if self.done or self._prof is None:
            self.done = True
            return
        self._prof.stop()
        self.done = True
        if isinstance(getattr(self.engine, "timers", None), _RangedTimers):
            self.engine.timers = self.engine.timers._timers
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._prof.export_chrome_trace(str(self.out_dir / TRACE_FILE))
        (self.out_dir / OPS_FILE).write_text(ops_table(self._prof.events(), self.cfg.top_ops, self.recorded))
        log.info("profile: %d engine steps in %s and %s", self.recorded, TRACE_FILE, OPS_FILE)


def stage_ops(events) -> dict[str, dict]:
    """Per stage range: its calls, total time, and per op under it (at any depth) calls and self time (us).
    An engine without stage timers (engine=hf) gets one stage, its whole steps."""
    ranges = [ev for ev in events if ev.name.startswith(RANGE)]
    if not ranges:
        ranges = [ev for ev in events if ev.name == STEP]
    stages: dict[str, dict] = {}
    for ev in ranges:
        name = ev.name[len(RANGE):] if ev.name.startswith(RANGE) else "step"
        st = stages.setdefault(name, {"calls": 0, "cpu_us": 0.0, "device_us": 0.0,
                                      "ops": defaultdict(lambda: [0, 0.0, 0.0])})
        st["calls"] += 1
        st["cpu_us"] += ev.cpu_time_total
        st["device_us"] += ev.device_time_total
        todo = list(ev.cpu_children)
        while todo:
            op = todo.pop()
            todo.extend(op.cpu_children)
            row = st["ops"][op.name]
            row[0] += 1
            row[1] += op.self_cpu_time_total
            row[2] += op.self_device_time_total
    return stages


def _share(us: float, stage: dict) -> str:
    return f"{us / stage['cpu_us']:.1%}" if stage["cpu_us"] else "-"


def ops_table(events, top: int, steps: int) -> str:
    stages = stage_ops(events)
    lines = [f"# Top ops per engine stage ({steps} engine steps profiled)", "",
             "Self time: time in the op itself, not in the ops it calls. Device time is 0 on a CPU.", ""]
    for name, st in sorted(stages.items(), key=lambda kv: -kv[1]["cpu_us"]):
        lines += [f"## {name}: {st['calls']} calls, {st['cpu_us'] / 1000:.1f} ms CPU, "
                  f"{st['device_us'] / 1000:.1f} ms device", "",
                  "| op | calls | self CPU ms | self device ms | share of stage CPU |", "|---|---|---|---|---|"]
        rows = sorted(st["ops"].items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:top]
        for op, (calls, cpu, dev) in rows:
            lines.append(f"| `{op}` | {calls} | {cpu / 1000:.2f} | {dev / 1000:.2f} | {_share(cpu, st)} |")
        # what no torch op accounts for: the engine's own Python (scheduling, bookkeeping, detokenizing)
        python = max(0.0, st["cpu_us"] - sum(cpu for _, cpu, _ in st["ops"].values()))
        lines += [f"| (Python outside torch ops) | - | {python / 1000:.2f} | - | {_share(python, st)} |", ""]
    if not stages:
        lines.append("No engine stage ran inside the profiled steps.")
    return "\n".join(lines) + "\n"
