"""Soak bookkeeping on hand-made data, exact results: the config's bounds, which window each record and
sample lands in and what it adds there, the memory slope, every gate's status *and* reason (soak.json and
the report print them), the bad-request table. tests/test_soak.py holds the gates' pass/fail on realistic
synthetic soaks and the end-to-end run."""
from __future__ import annotations

import re

import pytest

from optladder.abtest.soak import Gate, Sample, SoakConfig, Window, as_dicts, bad_table, decide, slope_mib_per_min, windows


# --- SoakConfig ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(duration_min=0.5, window_s=0.5, sample_s=0.5, warmup_min=0), dict(warmup_min=0),
                                dict(warmup_min=0.5), dict(max_users=1), dict(client="locust"),
                                dict(client="threads"), dict(bad_request_rate=0), dict(bad_request_rate=0.5)])
def test_soak_config_accepts_the_edges_of_its_ranges(kw):
    SoakConfig(**kw)


POSITIVE = "soak.duration_min, soak.window_s and soak.sample_s must be > 0"


@pytest.mark.parametrize("kw, message", [
    (dict(duration_min=0), POSITIVE), (dict(window_s=0), POSITIVE), (dict(sample_s=0), POSITIVE),
    (dict(duration_min=-1), POSITIVE),
    (dict(warmup_min=-0.5), "soak.warmup_min=-0.5 must be in [0, soak.duration_min=30.0)"),
    (dict(warmup_min=30.0), "soak.warmup_min=30.0 must be in [0, soak.duration_min=30.0)"),
    (dict(max_users=0), "soak.max_users must be >= 1, got 0"),
    (dict(client="http"), "soak.client='http' is not one of ['locust', 'threads']"),
    (dict(bad_request_rate=1.0), "soak.bad_request_rate=1.0 must be in [0, 1)"),
    (dict(bad_request_rate=-0.1), "soak.bad_request_rate=-0.1 must be in [0, 1)"),
])
def test_soak_config_refuses_values_outside_its_ranges(kw, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SoakConfig(**kw)


# --- windows ------------------------------------------------------------------------------------------------

def test_windows_place_records_by_finish_or_send_and_hold_exact_latencies():
    good = [
        # ok: by finished_at (window 0); ttft 0.25 s, tpot (13.25 - 10.25) / (4 - 1) = 1 s, e2e 3.25 s
        {"ok": True, "sent_at": 10.0, "first_token_at": 10.25, "finished_at": 13.25, "output_tokens": 4},
        # ok, sent in window 0 but finished in window 1; two tokens: tpot = (70 - 51) / 1 = 19 s
        {"ok": True, "sent_at": 50.0, "first_token_at": 51.0, "finished_at": 70.0, "output_tokens": 2},
        # ok, no first token and no token count: e2e only (10 s)
        {"ok": True, "sent_at": 100.0, "finished_at": 110.0},
        # failed: by sent_at (70 s, window 1), not by when it was scheduled
        {"ok": False, "sent_at": 70.0, "scheduled_at": 10.0, "finished_at": None},
        # failed, never sent: by scheduled_at (window 2)
        {"ok": False, "scheduled_at": 130.0},
        {"ok": False, "sent_at": 125.0, "scheduled_at": 125.0},
    ]
    bad = [{"kind": "too_long", "sent_at": 5.0}, {"kind": "too_long", "sent_at": 20.0},
           {"kind": "disconnect", "sent_at": 10.0}, {"kind": "too_long", "sent_at": 65.0}]
    w = windows(good, bad, [], 60.0, 180.0)
    assert [(x.index, x.start_s) for x in w] == [(0, 0.0), (1, 60.0), (2, 120.0)]
    assert [(x.requests, x.errors) for x in w] == [(1, 0), (3, 1), (2, 2)]
    assert [x.bad for x in w] == [{"too_long": 2, "disconnect": 1}, {"too_long": 1}, {}]
    assert w[0].latency_ms == {f"{m}_{p}": v for m, v in (("ttft", 250.0), ("tpot", 1000.0), ("e2e", 3250.0))
                               for p in ("p50", "p99", "p999")}
    # window 1: ttft and tpot of one request; e2e of two (20 s and 10 s): linear interpolation between them
    assert w[1].latency_ms == pytest.approx({"ttft_p50": 1000.0, "ttft_p99": 1000.0, "ttft_p999": 1000.0,
                                             "tpot_p50": 19000.0, "tpot_p99": 19000.0, "tpot_p999": 19000.0,
                                             "e2e_p50": 15000.0, "e2e_p99": 10000 + 0.99 * 10000,
                                             "e2e_p999": 10000 + 0.999 * 10000}, rel=1e-12)
    assert w[2].latency_ms == {}


def test_windows_put_records_without_a_time_at_zero_and_keep_at_least_one_window():
    # sent at 0.0 (falsy) or never sent nor scheduled: both count at t = 0, in the first 0.5 s window
    failed = [{"ok": False, "sent_at": 0.0}, {"ok": False}]
    w = windows(failed, [], [], 0.5, 2.0)
    assert [x.errors for x in w] == [2, 0, 0, 0] and [x.requests for x in w] == [2, 0, 0, 0]
    assert len(windows([], [], [], 60.0, 30.0)) == 1 and len(windows([], [], [], 60.0, 0.0)) == 1


def test_windows_tpot_needs_two_tokens_and_a_first_token():
    base = {"ok": True, "sent_at": 1.0, "finished_at": 4.0}
    for extra in ({"first_token_at": 2.0, "output_tokens": 1}, {"first_token_at": 2.0},
                  {"output_tokens": 5}):
        lat = windows([{**base, **extra}], [], [], 60.0, 60.0)[0].latency_ms
        assert "tpot_p50" not in lat and lat["e2e_p50"] == 3000.0
        assert ("ttft_p50" in lat) == ("first_token_at" in extra)
    lat = windows([{**base, "first_token_at": 2.0, "output_tokens": 3}], [], [], 60.0, 60.0)[0].latency_ms
    assert lat["tpot_p50"] == 1000.0 and lat["ttft_p50"] == 1000.0  # (4 - 2) / (3 - 1) s; 2 - 1 s


# --- memory slope -------------------------------------------------------------------------------------------

def mem(t: float, rss: float, anon: float | None = 0.0, device: float | None = None) -> Sample:
    return Sample(t, rss, anon, device, 0, 0)


def test_slope_is_per_minute_over_samples_from_after_s_on_and_needs_three():
    s = [mem(0.0, 900.0), mem(60.0, 100.0), mem(120.0, 102.0), mem(180.0, 104.0)]
    assert slope_mib_per_min(s, 60.0) == pytest.approx(2.0, rel=1e-9)  # rss by default; the t=0 one left out
    assert slope_mib_per_min(s, 60.0, "anon_mib") == pytest.approx(0.0, abs=1e-9)
    assert slope_mib_per_min(s, 61.0) is None  # two samples left
    assert slope_mib_per_min(s, 60.0, "device_mib") is None  # never measured


# --- decide -------------------------------------------------------------------------------------------------

CFG = SoakConfig(duration_min=5, window_s=60, warmup_min=1, max_mem_slope_mib_min=1.5, max_p999_ratio=1.5)


def p999_windows(values: dict[int, float]) -> list[Window]:
    return [Window(i, 60.0 * i, latency_ms={"e2e_p999": values[i]} if i in values else {}) for i in range(5)]


def run_decide(cfg=CFG, wins=None, samples=None, sent_good=None, sent_bad=None, good=None, bad=None,
               kv_all_free=True, aborted=0, end_s=300.0) -> list[tuple[str, str, str]]:
    good = [{"ok": True}] * 3 if good is None else good
    bad = [] if bad is None else bad
    gates = decide(cfg, p999_windows({1: 1000.0, 4: 1500.0}) if wins is None else wins,
                   [mem(60.0 * i, 0.0, 0.0) for i in range(5)] if samples is None else samples,
                   len(good) if sent_good is None else sent_good, len(bad) if sent_bad is None else sent_bad,
                   good, bad, kv_all_free, aborted, end_s)
    assert all(isinstance(g, Gate) for g in gates)
    return [(g.name, g.status, g.reason) for g in gates]


def gate(rows, name):
    return next((s, r) for n, s, r in rows if n == name)


def test_decide_reports_every_gate_with_its_numbers():
    # after the 1-min warm-up the anonymous memory grows 100, 101, 103, 104 MiB a minute apart: the least-squares
    # slope is 7 / 5 = 1.4 MiB/min (the sample before the warm-up and the resident-set numbers do not count)
    samples = [mem(0.0, 50.0, 900.0), *(mem(60.0 * (i + 1), 1000.0 * i, a) for i, a in enumerate((100, 101, 103, 104)))]
    rows = run_decide(samples=samples)
    assert rows == [
        ("memory:anon_mib", "pass",
         "anonymous resident memory grew +1.400 MiB/min after the 1-min warm-up (bound 1.5)"),
        ("kv_leak", "pass", "every KV block back in the pool at the end"),
        ("p999_stability", "pass", "E2E p99.9 1,000 ms in window 1, 1,500 ms in window 4 (1.50x, bound 1.5x)"),
        ("lost_records", "pass", "3/3 good and 0/0 bad requests on disk"),
        ("good_requests", "pass", "0 of 3 well-formed requests failed"),
        ("bad_requests", "pass", "0/0 answered as expected; 0 sequences aborted for 0 clients that hung up"),
    ]


def test_memory_gate_on_the_bound_passes_and_device_memory_has_its_own_gate():
    # zero everywhere: the slope is exactly 0.0, on a bound of 0
    zero = SoakConfig(duration_min=5, window_s=60, warmup_min=1, max_mem_slope_mib_min=0.0)
    assert gate(run_decide(cfg=zero), "memory:anon_mib")[0] == "pass"
    samples = [mem(60.0 * i, 0.0, 0.0, 10.0 + 2.0 * i) for i in range(1, 5)]  # device: +2 MiB/min
    assert gate(run_decide(samples=samples), "memory:device_mib") == (
        "fail", "device memory grew +2.000 MiB/min after the 1-min warm-up (bound 1.5)")
    # too few anonymous-memory samples fails the memory gate, and the device gate is still judged
    no_anon = [mem(60.0 * i, 0.0, None, 5.0) for i in range(1, 5)]
    rows = run_decide(samples=no_anon)
    assert [r[:2] for r in rows[:2]] == [("memory", "fail"), ("memory:device_mib", "pass")]
    assert rows[0][2] == "fewer than 3 memory samples after the warm-up"


def test_kv_leak_gate_fails_with_its_reason():
    assert gate(run_decide(kv_all_free=False), "kv_leak") == (
        "fail", "KV blocks still allocated after the last request finished")


def test_p999_gate_uses_full_windows_from_the_warm_up_on():
    # window 0 is before the 1-min warm-up, window 1 starts on it; the last window ends on end_s
    wins = p999_windows({0: 100.0, 1: 1000.0, 2: 9000.0, 4: 1499.0})
    assert gate(run_decide(wins=wins), "p999_stability") == (
        "pass", "E2E p99.9 1,000 ms in window 1, 1,499 ms in window 4 (1.50x, bound 1.5x)")
    # end_s half a window-second short: window 4 is not full, window 3 (without latencies) is skipped
    assert gate(run_decide(wins=wins, end_s=299.5), "p999_stability") == (
        "fail", "E2E p99.9 1,000 ms in window 1, 9,000 ms in window 2 (9.00x, bound 1.5x)")
    assert gate(run_decide(wins=p999_windows({1: 1000.0, 4: 1600.0})), "p999_stability") == (
        "fail", "E2E p99.9 1,000 ms in window 1, 1,600 ms in window 4 (1.60x, bound 1.5x)")
    two_ms = p999_windows({1: 2.0, 2: 1.0})
    assert gate(run_decide(wins=two_ms), "p999_stability") == (
        "pass", "E2E p99.9 2 ms in window 1, 1 ms in window 2 (0.50x, bound 1.5x)")
    only_one = p999_windows({0: 1.0, 1: 1.0})
    assert gate(run_decide(wins=only_one), "p999_stability") == (
        "fail", "fewer than two full windows after the warm-up")


def test_lost_records_counts_good_and_bad_separately():
    bad = [{"kind": "too_long", "ok": True, "status": 400}]
    assert gate(run_decide(sent_good=4, sent_bad=2, bad=bad), "lost_records") == (
        "fail", "3/4 good and 1/2 bad requests on disk")
    assert gate(run_decide(sent_good=4, sent_bad=0, bad=[]), "lost_records")[0] == "fail"


def test_good_and_bad_request_gates_name_the_first_failure():
    good = [{"ok": True}, {"ok": False, "error": "HTTP 503"}, {"ok": False, "error": "timeout"}]
    assert gate(run_decide(good=good), "good_requests") == (
        "fail", "2 of 3 well-formed requests failed; the first: HTTP 503")
    bad = [{"kind": "disconnect", "ok": True, "status": 200}, {"kind": "too_long", "ok": False, "status": 500},
           {"kind": "unknown_model", "ok": False, "status": 400}, {"kind": "wrong_key", "ok": True, "status": 401}]
    assert gate(run_decide(bad=bad, aborted=1), "bad_requests") == (
        "fail", "2/4 answered as expected; 1 sequences aborted for 1 clients that hung up; "
                "the first wrong: too_long got 500")
    right = [b for b in bad if b["ok"]]
    assert gate(run_decide(bad=right, aborted=1), "bad_requests") == (
        "pass", "2/2 answered as expected; 1 sequences aborted for 1 clients that hung up")
    assert gate(run_decide(bad=right, aborted=0), "bad_requests")[0] == "fail"


# --- bad_table, as_dicts ------------------------------------------------------------------------------------

def test_bad_table_counts_answers_per_kind_in_kind_order():
    bad = [{"kind": "disconnect", "expected": 200, "status": 200, "ok": True},
           {"kind": "too_long", "expected": 400, "status": 400, "ok": True},
           {"kind": "too_long", "expected": 400, "status": 500, "ok": False},
           {"kind": "too_long", "expected": 400, "status": 400, "ok": True},
           {"kind": "malformed_json", "expected": 400, "status": None, "ok": False}]
    assert bad_table(bad) == [
        {"kind": "malformed_json", "sent": 1, "expected": 400, "answers": {"None": 1}, "right": 0},
        {"kind": "too_long", "sent": 3, "expected": 400, "answers": {"400": 2, "500": 1}, "right": 2},
        {"kind": "disconnect", "sent": 1, "expected": 200, "answers": {"200": 1}, "right": 1},
    ]
    assert bad_table([]) == []


def test_as_dicts():
    assert as_dicts([Gate("kv_leak", "pass", "r"), Gate("memory", "fail", "s")]) == [
        {"name": "kv_leak", "status": "pass", "reason": "r"}, {"name": "memory", "status": "fail", "reason": "s"}]
