"""Capacity search: the bisection itself, against replays whose P99 E2E is a known function of the load
(the search is the thing under test, the replay is its input)."""
import math
import re

import pytest

from optladder.traffic.capacity import capacity_metrics, find_capacity, p99_e2e, requests_at
from optladder.traffic.metrics import SLO
from optladder.traffic.request import Request, RequestRecord


def records_with_e2e(e2e_s: float, n: int = 20, failed: int = 0) -> list[RequestRecord]:
    out = []
    for i in range(n):
        ok = i >= failed
        out.append(RequestRecord(f"r{i}", 0.0, 8, 4, sent_at=0.0, first_token_at=0.01,
                                 finished_at=e2e_s if ok else None, output_tokens=4 if ok else 0, ok=ok,
                                 error=None if ok else "timeout"))
    return out


class FakeReplay:
    """P99 E2E = slope * load: the SLO of 3 s is met up to load 3 / slope exactly. Counts its calls."""

    def __init__(self, slope: float):
        self.slope, self.loads = slope, []

    def __call__(self, load: float) -> list[RequestRecord]:
        self.loads.append(load)
        return records_with_e2e(self.slope * load)


def test_concurrency_bisection_finds_the_integer_threshold():
    fake = FakeReplay(slope=0.1)  # 30 passes (3.0 s), 31 fails
    result = find_capacity(fake, lo=1, hi=64, slo=SLO(e2e_s=3.0), mode="concurrency", iters=10)
    assert result.value == 30 and not result.at_hi
    assert all(isinstance(p.load, int) for p in result.probes)
    assert [p.load for p in result.probes] == fake.loads
    assert all(p.ok == (p.load <= 30) for p in result.probes)
    assert result.probes[0].load == 1 and result.probes[1].load == 64
    assert len(result.probes) <= 2 + math.ceil(math.log2(63))
    m = capacity_metrics(result)
    assert m == {"capacity/max_concurrency": 30.0, "capacity/slo_e2e_s": 3.0,
                 "capacity/probes": float(len(result.probes)), "capacity/at_hi": 0.0,
                 "capacity/search_s": sum(p.seconds for p in result.probes), "capacity/probes_stopped_early": 0.0}
    assert all(p.seconds >= 0 for p in result.probes)


def test_rate_bisection_lands_within_tolerance():
    fake = FakeReplay(slope=0.25)  # threshold at 12 req/s
    result = find_capacity(fake, lo=0.5, hi=40.0, mode="rate", iters=20, tolerance=0.05)
    assert 12.0 - 0.05 <= result.value <= 12.0
    assert "capacity/max_rate_req_s" in capacity_metrics(result)


def test_iters_caps_the_number_of_probes():
    fake = FakeReplay(slope=0.25)
    result = find_capacity(fake, lo=0.5, hi=40.0, mode="rate", iters=3)
    assert len(fake.loads) == 2 + 3
    assert result.value <= 12.0  # the largest load seen to pass: never above the threshold


def test_edges_lo_fails_and_hi_passes():
    none = find_capacity(FakeReplay(slope=10.0), lo=1, hi=8)
    assert none.value == 0 and len(none.probes) == 1 and capacity_metrics(none)["capacity/max_concurrency"] == 0
    capped = find_capacity(FakeReplay(slope=0.01), lo=1, hi=8)
    assert capped.value == 8 and capped.at_hi and len(capped.probes) == 2


def test_failed_requests_count_as_infinitely_slow():
    assert p99_e2e(records_with_e2e(0.5)) == pytest.approx(0.5)
    assert p99_e2e(records_with_e2e(0.5, n=20, failed=1)) == math.inf  # 5% failed: beyond P99
    assert p99_e2e([]) == math.inf

    def fails_above_4(load):  # fast but erroring at high load must not pass
        return records_with_e2e(0.1, failed=5 if load > 4 else 0)

    result = find_capacity(fails_above_4, lo=1, hi=16)
    assert result.value == 4
    assert all(p.failed == 5 for p in result.probes if not p.ok)
    assert result.to_dict()["probes"][1]["p99_e2e_s"] is None  # strict JSON for capacity.json


def test_requests_at_builds_the_probe_workload():
    reqs = [Request(f"q{i}", [1, 2, 3], 4, scheduled_at=99.0) for i in range(3)]
    closed = requests_at(reqs, 7, 4, "concurrency")
    assert len(closed) == 7 and len({r.id for r in closed}) == 7
    assert all(r.scheduled_at == 0.0 for r in closed)
    opened = requests_at(reqs, 200, 10.0, "rate", seed=1)
    times = [r.scheduled_at for r in opened]
    assert times == sorted(times) and (len(times) - 1) / times[-1] == pytest.approx(10.0, rel=0.2)
    assert [r.scheduled_at for r in requests_at(reqs, 200, 10.0, "rate", seed=1)] == times


@pytest.mark.parametrize("kwargs, match", [
    ({"lo": 0, "hi": 4}, "0 < lo <= hi"),
    ({"lo": 5, "hi": 4}, "0 < lo <= hi"),
    ({"lo": 1.5, "hi": 4}, "whole numbers"),
    ({"lo": 1, "hi": 4, "mode": "qps"}, "not one of"),
    ({"lo": 1, "hi": 4, "iters": -1}, "iters"),
])
def test_bad_search_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        find_capacity(FakeReplay(1.0), **kwargs)


def test_every_probe_is_recorded_whole_and_to_dict_keeps_finite_values():
    result = find_capacity(FakeReplay(slope=0.5), lo=2, hi=8)  # passes up to 6
    assert [(p.load, p.p99_e2e_s, p.ok, p.requests, p.failed) for p in result.probes] == [
        (2, 1.0, True, 20, 0), (8, 4.0, False, 20, 0), (5, 2.5, True, 20, 0), (6, 3.0, True, 20, 0),
        (7, 3.5, False, 20, 0)]
    assert (result.value, result.mode, result.slo_e2e_s) == (6, "concurrency", 3.0)
    assert [p["p99_e2e_s"] for p in result.to_dict()["probes"]] == [1.0, 4.0, 2.5, 3.0, 3.5]


def test_one_passing_probe_at_lo_is_the_answer_until_something_larger_passes():
    result = find_capacity(FakeReplay(slope=1.0), lo=3, hi=8, iters=0)  # 3 passes, 8 fails, no bisection
    assert result.value == 3 and [p.load for p in result.probes] == [3, 8]


def test_default_tolerance_stops_concurrency_at_adjacent_integers_and_rate_at_a_percent_of_hi():
    fake = FakeReplay(slope=0.1)
    find_capacity(fake, lo=1, hi=64, iters=50)
    assert fake.loads == [1, 64, 32, 16, 24, 28, 30, 31]  # stops once 30 passes and 31 fails
    rate = FakeReplay(slope=0.25)
    result = find_capacity(rate, lo=1.0, hi=40.0, mode="rate", iters=50)
    assert 12.0 - 0.4 <= result.value <= 12.0 and len(rate.loads) == 2 + 7  # 39 / 2^7 < 0.4 <= 39 / 2^6


def test_p99_counts_only_requests_that_succeeded_and_uses_the_99th_percentile():
    recs = records_with_e2e(1.0, n=200)
    for i, r in enumerate(recs):
        r.finished_at = (i + 1) / 100  # E2E 0.01 .. 2.00
    assert p99_e2e(recs) == pytest.approx(1.9801)  # rank 197.01 of 0..199
    recs[0].ok = False  # its E2E is the smallest, but a failure counts as infinitely slow: the next rank up
    assert p99_e2e(recs) == pytest.approx(2.0)


@pytest.mark.parametrize("kwargs, match", [
    ({"lo": 2, "hi": 2}, None), ({"lo": 1, "hi": 4, "iters": 0}, None),
    ({"lo": 1, "hi": 4, "tolerance": 0}, "capacity tolerance must be > 0, got 0"),
    ({"lo": 1, "hi": 4, "tolerance": -1}, "capacity tolerance must be > 0, got -1")])
def test_search_edges(kwargs, match):
    if match is None:
        find_capacity(FakeReplay(0.1), **kwargs)
    else:
        with pytest.raises(ValueError, match=re.escape(match)):
            find_capacity(FakeReplay(0.1), **kwargs)


def test_probe_workloads_reuse_the_requests_and_number_the_copies():
    reqs = [Request(f"q{i}", [1, 2, 3], 4) for i in range(2)]
    assert [r.id for r in requests_at(reqs, 5, 2, "concurrency")] == ["q0", "q1", "q0-c1", "q1-c1", "q0-c2"]
    default = [r.scheduled_at for r in requests_at(reqs, 5, 3.0, "rate")]
    assert default == [r.scheduled_at for r in requests_at(reqs, 5, 3.0, "rate", seed=0)]
    assert default != [r.scheduled_at for r in requests_at(reqs, 5, 3.0, "rate", seed=1)]
    with pytest.raises(ValueError, match=re.escape("capacity search needs at least one request to replay")):
        requests_at([], 5, 2, "concurrency")


def _rec(i: int, e2e_s: float | None) -> RequestRecord:
    ok = e2e_s is not None
    return RequestRecord(f"r{i}", 0.0, 8, 4, sent_at=0.0, first_token_at=0.0 if ok else None,
                         finished_at=e2e_s, output_tokens=4 if ok else 0, ok=ok, error=None if ok else "timeout")


def _stops_after(e2es, slo_s=3.0):
    """How many records stop_when_missed took before raising (None: it let the probe run to the end)."""
    from optladder.traffic.capacity import stop_when_missed
    from optladder.traffic.replay import StopReplay

    cb = stop_when_missed(len(e2es), slo_s)
    for i, e in enumerate(e2es):
        try:
            cb(_rec(i, e))
        except StopReplay as why:
            assert "3 s SLO" in str(why)
            return i + 1
    return None


def test_a_probe_stops_once_its_p99_must_miss_the_slo():
    # 32 requests: P99 interpolates between the two slowest, so one slow answer (2.76 s at most with the rest
    # instant) cannot decide it, two can; a failure counts as infinitely slow and decides at once
    assert _stops_after([4.0, 4.0] + [0.1] * 30) == 2
    assert _stops_after([4.0] + [0.1] * 31) is None
    assert _stops_after([None] + [0.1] * 31) == 1
    assert _stops_after([0.1] * 31 + [9.0]) is None  # the last record: nothing left to save
    assert _stops_after([2.9] * 32) is None


def test_a_stopped_probe_is_always_one_the_whole_probe_fails():
    # the lower bound only stops what must fail: over random orders and mixes, whenever it stops a probe the
    # full probe's P99 is over the SLO; and it stops most probes that fail well before their end
    import random

    rng = random.Random(7)
    stopped_failing = failing = 0
    for _ in range(400):
        n = rng.choice([8, 32, 100])
        slow = rng.random()
        e2es = [None if rng.random() < 0.02 else rng.uniform(0, 2.5) + (rng.random() < slow) * rng.uniform(0, 6)
                for _ in range(n)]
        at = _stops_after(e2es)
        full = p99_e2e([_rec(i, e) for i, e in enumerate(e2es)])
        if at is not None:
            assert full > 3.0, (e2es, at)
        if full > 3.0:
            failing += 1
            stopped_failing += at is not None and at < n
    assert stopped_failing > failing // 2


def test_stopped_requests_are_counted_in_the_probe():
    from optladder.traffic.request import STOPPED

    recs = records_with_e2e(1.0, n=4)
    recs[3].finished_at, recs[3].ok, recs[3].error = None, False, STOPPED + "decided"
    result = find_capacity(lambda load: recs, 1, 1)
    assert (result.probes[0].failed, result.probes[0].stopped) == (1, 1) and result.value == 0
