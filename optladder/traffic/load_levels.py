"""Load curves: the same requests replayed at several loads, because one replay rate says little about a
change that helps at low load and hurts at high load.

A level sets the knob of the workload's own arrival process: `workload.time_scale` for a trace's timing
(0.5 replays it twice as fast), `workload.rate` (req/s) for Poisson or gamma arrivals, `workload.concurrency`
for a closed loop. Open-loop schedules are rescaled, not redrawn: with the same seed a Poisson or gamma
schedule at another rate is exactly the old one stretched, so the levels differ in load only.

Per level, the headline metrics under `load/` plus the two axes of a serving trade-off (as vLLM's
`bench sweep plot_pareto` draws them): output tok/s per user = output tok/s / mean requests in flight
(Little's law: the sum of E2E over the makespan; in a closed loop, the concurrency), and output tok/s per
GPU = output tok/s / the GPUs the engine used (1 for one device, CPU included).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from optladder.traffic.metrics import SLO, compute_metrics, makespan
from optladder.traffic.request import Request, RequestRecord

KNOBS = {"trace": "workload.time_scale", "poisson": "workload.rate", "gamma": "workload.rate",
         "closed": "workload.concurrency"}
HEADLINE = ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "e2e_ms_p50", "e2e_ms_p99",
            "throughput_req_s", "throughput_out_tok_s", "goodput_req_s", "requests_ok", "requests_failed")


@dataclass
class LevelPlan:
    index: int
    value: float  # the knob's value at this level
    knob: str
    requests: list[Request]
    mode: str  # open | closed
    concurrency: int


def validate_levels(levels: list[float], arrival: str) -> None:
    if arrival not in KNOBS:
        raise ValueError(f"workload.arrival={arrival!r} is not one of {list(KNOBS)}")
    for v in levels:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"replay.load_levels: each level must be a number > 0, got {v!r}")
        if arrival == "closed" and float(v) != int(v):
            raise ValueError(f"replay.load_levels: with workload.arrival=closed a level is a concurrency, "
                             f"a whole number; got {v!r}")


def plan_levels(requests: list[Request], levels: list[float], arrival: str, time_scale: float,
                rate: float) -> list[LevelPlan]:
    """The requests as sent at each level; `time_scale` and `rate`: the workload's own settings."""
    validate_levels(levels, arrival)
    plans = []
    for i, v in enumerate(levels):
        if arrival == "closed":
            plans.append(LevelPlan(i, float(v), KNOBS[arrival], list(requests), "closed", int(v)))
            continue
        factor = v / time_scale if arrival == "trace" else rate / v
        reqs = [replace(r, scheduled_at=r.scheduled_at * factor) for r in requests]
        plans.append(LevelPlan(i, float(v), KNOBS[arrival], reqs, "open", 1))
    return plans


def level_metrics(records: list[RequestRecord], slo: SLO | None = None, gpus: int = 1) -> dict[str, float]:
    """`load/*` of one level: the headline metrics, mean requests in flight, tok/s per user and per GPU."""
    perf = compute_metrics(records, slo)
    out = {f"load/{k}": perf[f"perf/{k}"] for k in HEADLINE if f"perf/{k}" in perf}
    ok = [r for r in records if r.ok and r.e2e is not None]
    span = makespan(ok)
    tok_s = perf.get("perf/throughput_out_tok_s", 0.0)
    in_flight = sum(r.e2e for r in ok) / span if span > 0 else 0.0
    out["load/mean_in_flight"] = in_flight
    out["load/out_tok_s_per_user"] = tok_s / in_flight if in_flight > 0 else 0.0
    out["load/out_tok_s_per_gpu"] = tok_s / gpus
    return out
