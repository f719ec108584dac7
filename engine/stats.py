"""Stage timers and KV occupancy over a run. No torch."""
from __future__ import annotations

import math
import time
from collections import defaultdict
from contextlib import contextmanager

# draft: proposing speculative drafts; verify: a decode step that verifies drafts (with prompt tokens: mixed)
STAGES = ("tokenize", "schedule", "prefill", "decode", "mixed", "draft", "verify", "sample", "detokenize")


class StageTimers:
    """Per-call durations of each engine stage; the spread tells scheduling noise (high variance) from
    compute (low variance)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)

    def add(self, stage: str, seconds: float) -> None:
        assert stage in STAGES, stage
        self.samples[stage].append(seconds)

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
        self.samples.clear()

    def metrics(self) -> dict[str, float]:
        out = {}
        for stage, xs in self.samples.items():
            mean = sum(xs) / len(xs)
            var = sum((x - mean) ** 2 for x in xs) / len(xs)
            out[f"stage/{stage}_ms_mean"] = mean * 1000
            out[f"stage/{stage}_ms_std"] = math.sqrt(var) * 1000
            out[f"stage/{stage}_count"] = float(len(xs))
        return out


class KVTimeline:
    """(time, reserved bytes, used bytes) after each step: the memory effect of paged KV over time."""

    def __init__(self, bytes_per_token: int) -> None:
        self.bytes_per_token = bytes_per_token
        self.points: list[tuple[float, int, int]] = []

    def record(self, t: float, reserved_tokens: int, used_tokens: int) -> None:
        self.points.append((t, reserved_tokens * self.bytes_per_token, used_tokens * self.bytes_per_token))

    def reset(self) -> None:
        self.points.clear()

    def metrics(self) -> dict[str, float]:
        busy = [(r, u) for _, r, u in self.points if r > 0]
        if not busy:
            return {}
        gib = float(1 << 30)
        return {
            "perf/kv_reserved_gb": max(r for r, _ in busy) / gib,
            "perf/kv_used_gb": max(u for _, u in busy) / gib,
            # time-averaged over the steps that held any KV: how much of what was set aside was used
            "perf/kv_util": sum(u / r for r, u in busy) / len(busy),
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
