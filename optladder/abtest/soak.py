"""A soak's decisions, on plain data: the per-window report and the verdict gates.

Gates (each pass or fail, with its numbers):
- memory: the slope of anonymous resident memory (and device memory, where there is a device) over the
  samples after the warm-up, by least squares, at most `max_mem_slope_mib_min` MiB per minute;
- kv_leak: once the last request has finished, every KV block is back in the pool;
- p999_stability: the E2E p99.9 of the last full window at most `max_p999_ratio` x the first's after warm-up;
- lost_records: every request sent has its record on disk (good and bad alike);
- good_requests: no well-formed request failed (the engine kept serving through the bad ones);
- bad_requests: each bad request got its expected answer, and every client that hung up had its sequence
  aborted in the engine.
No torch, no I/O.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from optladder.traffic.bad_requests import KINDS

PCTS = {"p50": 50.0, "p99": 99.0, "p999": 99.9}


@dataclass
class SoakConfig:
    name: str = "soak"
    duration_min: float = 30.0
    window_s: float = 60.0
    warmup_min: float = 2.0  # memory and the first window are taken after this
    bad_request_rate: float = 0.0  # the fraction of all requests that are bad (optladder/traffic/bad_requests.py)
    sample_s: float = 1.0  # memory and KV sampling interval
    max_body_bytes: int = 1 << 20  # the soak server's body limit (its oversized_body kind sends one byte more)
    max_mem_slope_mib_min: float = 1.0
    max_p999_ratio: float = 1.5
    client: str = "locust"  # locust (its own process) | threads (stdlib, in this process: for the GPU image)
    # requests waiting or in flight at once on the client; locust spawns that many users before its clock
    # starts, which takes minutes for a thousand on a busy 2-core machine
    max_users: int = 128

    def __post_init__(self) -> None:
        if self.duration_min <= 0 or self.window_s <= 0 or self.sample_s <= 0:
            raise ValueError("soak.duration_min, soak.window_s and soak.sample_s must be > 0")
        if not 0 <= self.warmup_min < self.duration_min:
            raise ValueError(f"soak.warmup_min={self.warmup_min} must be in [0, soak.duration_min="
                             f"{self.duration_min})")
        if self.max_users < 1:
            raise ValueError(f"soak.max_users must be >= 1, got {self.max_users}")
        if self.client not in ("locust", "threads"):
            raise ValueError(f"soak.client={self.client!r} is not one of ['locust', 'threads']")
        if not 0 <= self.bad_request_rate < 1:
            raise ValueError(f"soak.bad_request_rate={self.bad_request_rate} must be in [0, 1)")


@dataclass
class Sample:
    t: float  # seconds since the soak's start
    rss_mib: float
    anon_mib: float  # resident minus file-backed: what a leak grows (the kernel drops file pages under pressure)
    device_mib: float | None
    kv_used_blocks: int
    kv_free_blocks: int


@dataclass
class Window:
    index: int
    start_s: float
    requests: int = 0
    errors: int = 0
    bad: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)  # ttft/tpot/e2e x p50/p99/p999
    rss_mib: float = 0.0  # the last sample of the window
    anon_mib: float = 0.0
    device_mib: float | None = None
    kv_used_blocks: int = 0  # the most in use at a sample of the window
    kv_free_blocks: int = 0  # the fewest free


def windows(good: list[dict], bad: list[dict], samples: list[Sample], window_s: float, end_s: float) -> list[Window]:
    """Good request records (dicts of requests.jsonl) by the window they finished in, bad ones by when sent."""
    n = max(1, int(np.ceil(end_s / window_s)))
    out = [Window(i, i * window_s) for i in range(n)]
    lat: list[dict[str, list[float]]] = [{} for _ in range(n)]

    def at(t: float) -> int:
        return min(n - 1, max(0, int(t // window_s)))

    for r in good:
        t = r.get("finished_at") if r.get("ok") else (r.get("sent_at") or r.get("scheduled_at") or 0.0)
        w = at(t or 0.0)
        out[w].requests += 1
        if not r.get("ok"):
            out[w].errors += 1
            continue
        for name, value in (("ttft", _ttft(r)), ("tpot", _tpot(r)), ("e2e", r["finished_at"] - r["sent_at"])):
            if value is not None:
                lat[w].setdefault(name, []).append(value * 1000)
    for b in bad:
        w = out[at(b["sent_at"])]
        w.bad[b["kind"]] = w.bad.get(b["kind"], 0) + 1
    for s in samples:
        w = out[at(s.t)]
        w.rss_mib, w.anon_mib, w.device_mib = s.rss_mib, s.anon_mib, s.device_mib
        w.kv_used_blocks = max(w.kv_used_blocks, s.kv_used_blocks)
        w.kv_free_blocks = s.kv_free_blocks if w.kv_free_blocks == 0 else min(w.kv_free_blocks, s.kv_free_blocks)
    for w, values in zip(out, lat):
        for name, xs in values.items():
            for p, q in PCTS.items():
                w.latency_ms[f"{name}_{p}"] = float(np.percentile(xs, q))
    return out


def _ttft(r: dict) -> float | None:
    return None if r.get("first_token_at") is None else r["first_token_at"] - r["sent_at"]


def _tpot(r: dict) -> float | None:
    n = r.get("output_tokens") or 0
    return None if n < 2 or r.get("first_token_at") is None else (r["finished_at"] - r["first_token_at"]) / (n - 1)


def slope_mib_per_min(samples: list[Sample], after_s: float, attr: str = "rss_mib") -> float | None:
    pts = [(s.t, getattr(s, attr)) for s in samples if s.t >= after_s and getattr(s, attr) is not None]
    if len(pts) < 3:
        return None
    t, m = np.array(pts, dtype=np.float64).T
    return float(np.polyfit(t / 60.0, m, 1)[0])


@dataclass
class Gate:
    name: str
    status: str  # pass | fail
    reason: str


def decide(cfg: SoakConfig, wins: list[Window], samples: list[Sample], sent_good: int, sent_bad: int,
           good: list[dict], bad: list[dict], kv_all_free: bool, aborted: int, end_s: float) -> list[Gate]:
    warm = cfg.warmup_min * 60
    gates = []
    for attr, what in (("anon_mib", "anonymous resident memory"), ("device_mib", "device memory")):
        slope = slope_mib_per_min(samples, warm, attr)
        if slope is None:
            if attr == "anon_mib":
                gates.append(Gate("memory", "fail", "fewer than 3 memory samples after the warm-up"))
            continue
        ok = slope <= cfg.max_mem_slope_mib_min
        gates.append(Gate(f"memory:{attr}", "pass" if ok else "fail", f"{what} grew {slope:+.3f} MiB/min after "
                          f"the {cfg.warmup_min:g}-min warm-up (bound {cfg.max_mem_slope_mib_min:g})"))
    gates.append(Gate("kv_leak", "pass" if kv_all_free else "fail",
                      "every KV block back in the pool at the end" if kv_all_free else
                      "KV blocks still allocated after the last request finished"))
    full = [w for w in wins if w.start_s >= warm and w.start_s + cfg.window_s <= end_s + 1e-6
            and "e2e_p999" in w.latency_ms]
    if len(full) >= 2:
        first, last = full[0].latency_ms["e2e_p999"], full[-1].latency_ms["e2e_p999"]
        ok = last <= cfg.max_p999_ratio * first
        gates.append(Gate("p999_stability", "pass" if ok else "fail", f"E2E p99.9 {first:,.0f} ms in window "
                          f"{full[0].index}, {last:,.0f} ms in window {full[-1].index} ({last / first:.2f}x, bound "
                          f"{cfg.max_p999_ratio:g}x)"))
    else:
        gates.append(Gate("p999_stability", "fail", "fewer than two full windows after the warm-up"))
    lost = (sent_good - len(good)) + (sent_bad - len(bad))
    gates.append(Gate("lost_records", "pass" if lost == 0 else "fail", f"{len(good)}/{sent_good} good and "
                      f"{len(bad)}/{sent_bad} bad requests on disk"))
    failed = [r for r in good if not r.get("ok")]
    gates.append(Gate("good_requests", "pass" if not failed else "fail", f"{len(failed)} of {len(good)} "
                      f"well-formed requests failed" + (f"; the first: {failed[0].get('error')}" if failed else "")))
    wrong = [b for b in bad if not b["ok"]]
    disconnects = sum(b["kind"] == "disconnect" for b in bad)
    ok = not wrong and aborted == disconnects
    gates.append(Gate("bad_requests", "pass" if ok else "fail", f"{len(bad) - len(wrong)}/{len(bad)} answered "
                      f"as expected; {aborted} sequences aborted for {disconnects} clients that hung up"
                      + (f"; the first wrong: {wrong[0]['kind']} got {wrong[0]['status']}" if wrong else "")))
    return gates


def bad_table(bad: list[dict]) -> list[dict]:
    """Per kind: how many, the answer expected, the answers received and how many were right."""
    rows = []
    for kind in KINDS:
        these = [b for b in bad if b["kind"] == kind]
        if these:
            got: dict[str, int] = {}
            for b in these:
                key = str(b["status"])
                got[key] = got.get(key, 0) + 1
            rows.append({"kind": kind, "sent": len(these), "expected": these[0]["expected"], "answers": got,
                         "right": sum(b["ok"] for b in these)})
    return rows


def as_dicts(items) -> list[dict]:
    return [asdict(x) for x in items]
