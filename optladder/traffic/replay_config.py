"""How a replay is driven and watched: the config's `replay` group, and the one settings object every
driver (in process, over HTTP) and the capacity search take. optladder/experiments/schema.py registers this same
dataclass as the group's schema, so `replay.<key>` keeps its name down to the line that reads it.

When requests are sent is not a replay setting but a property of the workload (its arrival process):
`Pacing`, built from the workload and passed beside the settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from optladder.traffic.capacity import MODES as CAPACITY_MODES, validate_search
from optladder.traffic.load_levels import validate_levels

DRIVERS = ("inprocess", "locust")  # inprocess: the engine stepped in this process; locust: over HTTP
ENDPOINTS = ("completions", "chat")
PACING_MODES = ("open", "closed")


@dataclass
class ReplayConfig:
    driver: str = "inprocess"
    # completions: exact prompt lengths as token ids; chat: the prompt text through the server's template
    endpoint: str = "completions"
    warmup_requests: int = 2
    lateness_warn_ms: float = 50.0  # warn when p99 lateness exceeds this: the driver is being measured
    progress: bool = True
    request_timeout_s: float = 3600.0  # over HTTP: per request, queueing included (a CPU replay queues for minutes)
    max_users: int = 1000  # over HTTP, open loop: at most this many requests waiting or in flight at once
    # capacity search, after the main replay: python run.py replay.capacity=true [replay.capacity_mode=rate]
    capacity: bool = False
    capacity_mode: str = "concurrency"  # concurrency: closed loop | rate: open loop, Poisson, req/s
    capacity_lo: float = 1.0
    capacity_hi: float = 64.0
    capacity_iters: int = 6  # bisection probes after lo and hi
    # per probe, the workload's first requests (cycled if fewer); with capacity_mode=concurrency at least
    # capacity_hi, or a probe could never reach its concurrency (loads above it would be the same load)
    capacity_requests: int = 64
    # in process: a probe stops once its P99 E2E can no longer meet the SLO (the requests still to finish
    # counted as instantly served), its unfinished requests aborted and counted failed; its verdict is unchanged
    capacity_stop_early: bool = True
    # after the main replay, the same requests at each load: time scales (arrival=trace), rates in req/s
    # (poisson, gamma) or concurrencies (closed); optladder/traffic/load_levels.py
    load_levels: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        _one_of("replay.driver", self.driver, DRIVERS)
        _one_of("replay.endpoint", self.endpoint, ENDPOINTS)
        _one_of("replay.capacity_mode", self.capacity_mode, CAPACITY_MODES)
        for name, least in (("warmup_requests", 0), ("max_users", 1), ("capacity_requests", 1)):
            if getattr(self, name) < least:
                raise ValueError(f"replay.{name} must be >= {least}, got {getattr(self, name)}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"replay.request_timeout_s must be > 0, got {self.request_timeout_s}")
        validate_search(self.capacity_lo, self.capacity_hi, self.capacity_mode, self.capacity_iters)
        if self.capacity_mode == "concurrency" and self.capacity_requests < self.capacity_hi:
            raise ValueError(f"replay.capacity_requests={self.capacity_requests} is below replay.capacity_hi="
                             f"{self.capacity_hi:g}: a closed-loop probe of {self.capacity_requests} requests never "
                             f"has more than {self.capacity_requests} in flight, so higher concurrencies would "
                             "probe the same load; raise capacity_requests or lower capacity_hi")
        validate_levels(list(self.load_levels), "poisson")  # the arrival-specific check runs with the workload


@dataclass(frozen=True)
class Pacing:
    """open: each request at its scheduled_at; closed: `concurrency` requests in flight, the next one sent as
    one finishes (the workload's `arrival: closed`)."""

    mode: str = "open"
    concurrency: int = 4

    def __post_init__(self) -> None:
        _one_of("replay mode", self.mode, PACING_MODES)
        if self.concurrency < 1:
            raise ValueError(f"replay concurrency must be >= 1, got {self.concurrency}")


def _one_of(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not one of {list(valid)}")
