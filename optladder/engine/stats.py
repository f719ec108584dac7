"""Stage timers and KV occupancy over a run. No torch.

Both are recorded at every engine step for as long as the engine lives, and an engine behind its HTTP server
(a soak, a deployment) steps for hours: what they keep is bounded. The timers keep running sums per stage,
not a duration per call; the KV timeline keeps its metrics as running aggregates over every step, and its
points (for plots) at most `max_points` of them, thinned to every 2nd, 4th, ... step as the run grows."""
from __future__ import annotations

import math
import time
from contextlib import contextmanager

# a KV point is ~140 bytes: 2 MiB at most, far more than a plot or the 500-point curve (run_views.py) shows
MAX_KV_POINTS = 16384
# draft: proposing speculative drafts; verify: a decode step that verifies drafts (with prompt tokens: mixed);
# prepare: the host building a forward's inputs (ids, positions, slots, block tables, their copies to the device),
# a part of that step's prefill/decode/mixed/verify time, timed on its own: on a GPU the device waits meanwhile
STAGES = ("tokenize", "schedule", "prepare", "prefill", "decode", "mixed", "draft", "verify", "sample", "detokenize")


class StageTimers:
    """Per-call durations of each engine stage, as count, mean and spread (Welford's running sums: O(1) per
    stage however long the engine runs); the spread tells scheduling noise (high variance) from compute
    (low variance)."""

    def __init__(self) -> None:
        self.stats: dict[str, _Running] = {}

    def add(self, stage: str, seconds: float) -> None:
        assert stage in STAGES, stage
        running = self.stats.get(stage)
        if running is None:
            running = self.stats[stage] = _Running()
        running.add(seconds)

    @contextmanager
    def time(self, stage: str, sync=None):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if sync is not None:
                sync()
            self.add(stage, time.perf_counter() - t0)

    def reset(self) -> None:
        self.stats.clear()

    def metrics(self) -> dict[str, float]:
        out = {}
        for stage, r in self.stats.items():
            out[f"stage/{stage}_ms_mean"] = r.mean * 1000
            out[f"stage/{stage}_ms_std"] = math.sqrt(r.m2 / r.n) * 1000
            out[f"stage/{stage}_count"] = float(r.n)
        return out


class _Running:
    """Count, sum and sum of squared deviations from the mean of a stream of numbers (the last by Welford)."""
    __slots__ = ("n", "total", "_mean", "m2")

    def __init__(self) -> None:
        self.n, self.total, self._mean, self.m2 = 0, 0.0, 0.0, 0.0

    def add(self, x: float) -> None:
        self.n += 1
        self.total += x
        delta = x - self._mean
        self._mean += delta / self.n
        self.m2 += delta * (x - self._mean)

    @property
    def mean(self) -> float:
        return self.total / self.n


class KVTimeline:
    """(time, reserved bytes, used bytes) after each step: the memory effect of paged KV over time.

    The metrics are running aggregates over every step. The points are kept for plots and curves, at most
    `max_points` of them: once full, every other one is dropped and from then on only every 2nd step is
    recorded (then every 4th, ...), so they stay an evenly spaced trace of the whole run, in bounded memory."""

    def __init__(self, bytes_per_token: int, max_points: int = MAX_KV_POINTS) -> None:
        assert max_points >= 2
        self.bytes_per_token = bytes_per_token
        self.max_points = max_points
        self.points: list[tuple[float, int, int]] = []
        self.reset()

    def record(self, t: float, reserved_tokens: int, used_tokens: int) -> None:
        r, u = reserved_tokens * self.bytes_per_token, used_tokens * self.bytes_per_token
        if r > 0:  # the steps that held any KV
            self._busy += 1
            self._max_reserved = max(self._max_reserved, r)
            self._max_used = max(self._max_used, u)
            self._util_sum += u / r
        if self._steps % self.stride == 0:
            if len(self.points) >= self.max_points:
                del self.points[1::2]
                self.stride *= 2
            if self._steps % self.stride == 0:
                self.points.append((t, r, u))
        self._steps += 1

    def reset(self) -> None:
        self.points.clear()
        self.stride = 1  # points hold every stride-th step
        self._steps = 0
        self._busy, self._max_reserved, self._max_used, self._util_sum = 0, 0, 0, 0.0

    def metrics(self) -> dict[str, float]:
        if not self._busy:
            return {}
        gib = float(1 << 30)
        return {
            "perf/kv_reserved_gb": self._max_reserved / gib,
            "perf/kv_used_gb": self._max_used / gib,
            # time-averaged over the steps that held any KV: how much of what was set aside was used
            "perf/kv_util": self._util_sum / self._busy,
        }


class StepStats:
    """What each step carried: prompt tokens and decode tokens, whether it mixed the two, and how long
    running decodes waited behind it (a step that left ready decodes out: a prompt-only step without
    chunked prefill, or a budget too small for them all)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = self.mixed_steps = 0
        self.prefill_tokens = self.decode_tokens = 0
        self.stall_s = 0.0  # wall time of steps that left ready decodes waiting
        self.stall_seq_s = 0.0  # the same, weighted by how many decodes waited

    def record(self, prefill_tokens: int, decode_tokens: int, seconds: float, decodes_waiting: int) -> None:
        self.steps += 1
        self.mixed_steps += prefill_tokens > 0 and decode_tokens > 0
        self.prefill_tokens += prefill_tokens
        self.decode_tokens += decode_tokens
        if decodes_waiting:
            self.stall_s += seconds
            self.stall_seq_s += seconds * decodes_waiting

    def metrics(self) -> dict[str, float]:
        n = max(1, self.steps)
        return {"perf/steps": float(self.steps), "perf/steps_mixed": float(self.mixed_steps),
                "perf/step_prefill_tokens_mean": self.prefill_tokens / n,
                "perf/step_decode_tokens_mean": self.decode_tokens / n,
                "perf/decode_stall_s": self.stall_s, "perf/decode_stall_seq_s": self.stall_seq_s}
