"""Latency, throughput and replay-accuracy metrics from per-request records (docs/design.md, "Metrics").

Pure functions over `RequestRecord`s: no torch, no I/O. Names returned are the MLflow metric names,
a contract that checks and dashboards read.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optladder.traffic.request import RequestRecord

PCTS = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9}


@dataclass
class SLO:
    """A request is 'good' when every set bound holds. Seconds.

    ttft_p99_s and tpot_p99_s bound a whole load level, not a request: a knob sweep's best config under the
    SLO is the one with the most output tok/s per GPU at the highest load level whose TTFT p99 and TPOT p99
    stay within them (optladder/experiments/slo_pick.py); null leaves that bound out. They choose among
    measurements and change none, so a resumed ladder ignores them (optladder/experiments/resume.py)."""

    e2e_s: float = 3.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    ttft_p99_s: float | None = 1.0  # interactive defaults: the first token within 1 s
    tpot_p99_s: float | None = 0.1  # and at least 10 tok/s per user after it

    def __post_init__(self) -> None:
        for name in ("e2e_s", "ttft_s", "tpot_s", "ttft_p99_s", "tpot_p99_s"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"slo.{name} must be > 0, got {v}")

    def met_by(self, r: RequestRecord) -> bool:
        if not r.ok or r.e2e is None:
            return False
        if r.e2e > self.e2e_s:
            return False
        if self.ttft_s is not None and (r.ttft is None or r.ttft > self.ttft_s):
            return False
        if self.tpot_s is not None and r.tpot is not None and r.tpot > self.tpot_s:
            return False
        return True


def percentile(values, q: float) -> float:
    """The one percentile of the project: linear interpolation between the two nearest ranks (numpy's
    default). Where a value is infinite (a failed request counted as infinitely slow) interpolating towards
    it gives nan, so the next observed value at or above the rank is taken instead."""
    a = np.asarray(values, dtype=np.float64)
    if not a.size:
        raise ValueError("percentile of no values")
    return float(np.percentile(a, q, method="higher" if np.isinf(a).any() else "linear"))


def summarize(values_s: list[float], prefix: str) -> dict[str, float]:
    """mean and percentiles of a list of seconds, reported in ms as `{prefix}_ms_{stat}`."""
    if not values_s:
        return {}
    a = np.asarray(values_s, dtype=np.float64) * 1000.0
    out = {f"{prefix}_ms_mean": float(a.mean())}
    for name, q in PCTS.items():
        out[f"{prefix}_ms_{name}"] = percentile(a, q)
    return out


def lateness_s(records: list[RequestRecord]) -> list[float]:
    """Lateness of every request that was sent, failed ones included: a driver that falls behind its
    schedule is late whatever the engine then does with the request."""
    return [r.lateness for r in records if r.lateness is not None]


def lateness_warning(records: list[RequestRecord], warn_ms: float, who: str = "driver") -> str | None:
    """The one lateness check of every driver: a message when p99 lateness exceeds `warn_ms`, else None."""
    late = lateness_s(records)
    if not late:
        return None
    p99_ms = percentile(late, 99) * 1000.0
    if p99_ms <= warn_ms:
        return None
    return (f"p99 replay lateness {p99_ms:.0f} ms exceeds {warn_ms:.0f} ms: the {who}, not the engine, "
            "is being measured")


def makespan(records: list[RequestRecord]) -> float:
    """From the first request sent to the last one finished."""
    sent = [r.sent_at for r in records if r.sent_at is not None]
    done = [r.finished_at for r in records if r.finished_at is not None]
    if not sent or not done:
        return 0.0
    return max(done) - min(sent)


def compute_metrics(records: list[RequestRecord], slo: SLO | None = None) -> dict[str, float]:
    """The `perf/*` metrics of docs/design.md from the records of one replay."""
    slo = slo or SLO()
    ok = [r for r in records if r.ok]
    m: dict[str, float] = {
        "perf/requests_ok": float(len(ok)),
        "perf/requests_failed": float(len(records) - len(ok)),
    }
    m.update(summarize([r.ttft for r in ok if r.ttft is not None], "perf/ttft"))
    m.update(summarize([r.tpot for r in ok if r.tpot is not None], "perf/tpot"))
    m.update(summarize([g for r in ok for g in r.itls], "perf/itl"))
    m.update(summarize([r.e2e for r in ok if r.e2e is not None], "perf/e2e"))
    late = summarize(lateness_s(records), "perf/lateness")
    m.update({k: v for k, v in late.items() if k.endswith(("_p50", "_p99"))})
    span = makespan(ok)
    if span > 0:
        m["perf/throughput_req_s"] = len(ok) / span
        m["perf/throughput_out_tok_s"] = sum(r.output_tokens for r in ok) / span
        m["perf/goodput_req_s"] = sum(slo.met_by(r) for r in ok) / span
    m["perf/makespan_s"] = span
    return m
