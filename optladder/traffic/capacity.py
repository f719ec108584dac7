"""Capacity: the largest load whose P99 E2E stays within the SLO (docs/design.md, "Metrics"), by bisection
over short replays.

    result = find_capacity(lambda c: replay_at(c), lo=1, hi=64, slo=SLO(e2e_s=3.0), mode="concurrency")
    metrics.update(capacity_metrics(result))

`run_replay(load)` replays a short workload at one load, a concurrency (closed loop, whole numbers) or
a request rate in req/s (open loop), and returns its records; how is the caller's business, so the
search runs unchanged over the in-process driver, HTTP, or a fake in a test. A failed request counts
as an infinite E2E: a load where requests time out or error is not within the SLO.

The search assumes P99 E2E grows with the load. It probes `lo` (if that fails there is no capacity in
range: 0), then `hi` (if that passes the answer is `hi`, a lower bound, flagged), then bisects the
bracket for at most `iters` more probes or until it is narrower than `tolerance`. The answer is the
largest load seen to pass. Short replays are noisy near the threshold: more requests per probe
(`capacity_requests`) buy a steadier answer.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from optladder.traffic.arrivals import poisson_arrivals
from optladder.traffic.metrics import SLO, percentile
from optladder.traffic.request import STOPPED, Request, RequestRecord, StopReplay

MODES = ("concurrency", "rate")


@dataclass
class Probe:
    load: float
    p99_e2e_s: float  # inf when any request in the top 1% failed
    ok: bool
    requests: int
    failed: int
    stopped: int = 0  # of the failed: unfinished when the probe stopped early (stop_when_missed)
    seconds: float = 0.0  # the probe's wall time


@dataclass
class CapacityResult:
    mode: str
    value: float  # the largest load that passed; 0 when even `lo` failed
    slo_e2e_s: float
    probes: list[Probe] = field(default_factory=list)
    at_hi: bool = False  # `hi` passed: the real capacity may be higher

    def to_dict(self) -> dict:
        """For capacity.json: strict JSON, so an infinite P99 (failed requests) is written as null."""
        d = asdict(self)
        for p in d["probes"]:
            p["p99_e2e_s"] = None if math.isinf(p["p99_e2e_s"]) else p["p99_e2e_s"]
        return d


def _e2e_or_inf(r: RequestRecord) -> float:
    return r.e2e if r.ok and r.e2e is not None else math.inf


def p99_e2e(records: list[RequestRecord]) -> float:
    """P99 of E2E in seconds, failed requests counted as infinitely slow."""
    if not records:
        return math.inf
    return percentile([_e2e_or_inf(r) for r in records], 99)


def stop_when_missed(n: int, slo_e2e_s: float) -> Callable[[RequestRecord], None]:
    """An on_record callback for one probe of n requests: it raises StopReplay once the probe's P99 E2E is
    above the SLO whatever the requests still out do, i.e. with each of them counted as served in no time
    (the percentile rises with every value, so this lower bound only rises as records come in). Only a probe
    that must fail is stopped: its verdict is the one the whole probe would give, sooner."""
    seen: list[float] = []

    def on_record(rec: RequestRecord) -> None:
        seen.append(_e2e_or_inf(rec))
        if len(seen) < n and percentile(seen + [0.0] * (n - len(seen)), 99) > slo_e2e_s:
            raise StopReplay(f"P99 E2E above the {slo_e2e_s:g} s SLO whatever the last {n - len(seen)} of "
                             f"{n} requests do")
    return on_record


def find_capacity(run_replay: Callable[[float], list[RequestRecord]], lo: float, hi: float,
                  slo: SLO | None = None, mode: str = "concurrency", iters: int = 6,
                  tolerance: float | None = None) -> CapacityResult:
    """Bisect [lo, hi] for the largest load whose P99 E2E <= slo.e2e_s. tolerance: the bracket width at
    which to stop (default 1 for concurrency, 1% of hi for rate)."""
    slo = slo or SLO()
    validate_search(lo, hi, mode, iters, tolerance)
    integer = mode == "concurrency"
    if integer:
        lo, hi = int(lo), int(hi)
    tolerance = tolerance if tolerance is not None else (1 if integer else 0.01 * hi)
    result = CapacityResult(mode, 0.0, slo.e2e_s)

    def probe(load: float) -> bool:
        t0 = time.perf_counter()
        records = run_replay(load)
        seconds = round(time.perf_counter() - t0, 3)
        p99 = p99_e2e(records)
        ok = p99 <= slo.e2e_s
        result.probes.append(Probe(load, p99, ok, len(records), sum(not r.ok for r in records),
                                   sum(bool(r.error and r.error.startswith(STOPPED)) for r in records), seconds))
        return ok

    if not probe(lo):
        return result
    result.value = lo
    if lo == hi or probe(hi):
        result.value, result.at_hi = hi, True
        return result
    good, bad = lo, hi  # invariant: `good` passed, `bad` failed
    for _ in range(iters):
        if bad - good <= tolerance:
            break
        mid = (good + bad) // 2 if integer else (good + bad) / 2
        if probe(mid):
            good = mid
        else:
            bad = mid
    result.value = good
    return result


def validate_search(lo: float, hi: float, mode: str, iters: int, tolerance: float | None = None) -> None:
    if mode not in MODES:
        raise ValueError(f"capacity mode {mode!r} is not one of {list(MODES)}")
    if not 0 < lo <= hi:
        raise ValueError(f"capacity needs 0 < lo <= hi, got lo={lo}, hi={hi}")
    if mode == "concurrency" and (int(lo) != lo or int(hi) != hi):
        raise ValueError(f"capacity mode=concurrency needs whole numbers, got lo={lo}, hi={hi}")
    if iters < 0:
        raise ValueError(f"capacity iters must be >= 0, got {iters}")
    if tolerance is not None and tolerance <= 0:
        raise ValueError(f"capacity tolerance must be > 0, got {tolerance}")


def requests_at(requests: list[Request], n: int, load: float, mode: str, seed: int = 0) -> list[Request]:
    """`n` requests (the given ones, cycled with fresh ids if there are fewer) set up for one probe:
    mode=rate: Poisson arrivals at `load` req/s, the same seed at every load so probes differ only in
    rate; mode=concurrency: no schedule (the driver keeps `load` in flight)."""
    if not requests:
        raise ValueError("capacity search needs at least one request to replay")
    picked = []
    for i in range(n):
        r = requests[i % len(requests)]
        picked.append(r if i < len(requests) else replace(r, id=f"{r.id}-c{i // len(requests)}"))
    times = poisson_arrivals(n, load, seed) if mode == "rate" else [0.0] * n
    return [replace(r, scheduled_at=t) for r, t in zip(picked, times)]


def capacity_metrics(result: CapacityResult) -> dict[str, float]:
    """The `capacity/*` metrics: the answer under its mode's name, the SLO it was held to, the probes (how
    many, how many stopped early, their wall time in all)."""
    name = "capacity/max_concurrency" if result.mode == "concurrency" else "capacity/max_rate_req_s"
    return {name: float(result.value), "capacity/slo_e2e_s": result.slo_e2e_s,
            "capacity/probes": float(len(result.probes)), "capacity/at_hi": float(result.at_hi),
            "capacity/search_s": sum(p.seconds for p in result.probes),
            "capacity/probes_stopped_early": float(sum(p.stopped > 0 for p in result.probes))}
