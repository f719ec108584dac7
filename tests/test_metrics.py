"""The metric definitions of DESIGN.md, checked on records with hand-computed answers."""
import math

import pytest

from optladder.traffic.metrics import SLO, compute_metrics, lateness_warning, percentile, summarize
from optladder.traffic.request import RequestRecord


def rec(id, sched, sent, tokens, ok=True):
    r = RequestRecord(id, sched, input_tokens=10, requested_output_tokens=len(tokens), sent_at=sent)
    r.token_times = list(tokens)
    r.first_token_at = tokens[0] if tokens else None
    r.finished_at = tokens[-1] if tokens else None
    r.output_tokens = len(tokens)
    r.ok = ok
    return r


def test_ttft_tpot_e2e_itl_lateness_by_hand():
    # sent at 1.0, tokens at 1.5, 1.7, 2.0: TTFT 0.5, E2E 1.0, TPOT (1.0-0.5)/2 = 0.25, ITL 0.2 and 0.3
    r = rec("a", sched=0.9, sent=1.0, tokens=[1.5, 1.7, 2.0])
    assert r.ttft == pytest.approx(0.5)
    assert r.e2e == pytest.approx(1.0)
    assert r.tpot == pytest.approx(0.25)
    assert r.itls == pytest.approx([0.2, 0.3])
    assert r.lateness == pytest.approx(0.1)


def test_tpot_needs_two_tokens():
    assert rec("a", 0, 0, [0.5]).tpot is None


def test_compute_metrics_by_hand():
    recs = [rec("a", 0.0, 0.0, [1.0, 2.0]),        # ttft 1, e2e 2, tpot 1
            rec("b", 1.0, 1.5, [2.5, 3.0, 3.5]),   # ttft 1, e2e 2, tpot 0.5, lateness 0.5
            rec("c", 2.0, 2.0, [6.0, 7.0]),         # ttft 4, e2e 5 (misses a 3 s SLO), tpot 1
            rec("d", 3.0, 3.0, [], ok=False)]
    m = compute_metrics(recs, SLO(e2e_s=3.0))
    assert m["perf/requests_ok"] == 3 and m["perf/requests_failed"] == 1
    assert m["perf/ttft_ms_mean"] == pytest.approx(2000.0)
    assert m["perf/ttft_ms_p50"] == pytest.approx(1000.0)
    assert m["perf/e2e_ms_p50"] == pytest.approx(2000.0)
    assert m["perf/tpot_ms_mean"] == pytest.approx((1000 + 500 + 1000) / 3)
    # ITL pooled: 1.0, 0.5, 0.5, 1.0 -> mean 750 ms
    assert m["perf/itl_ms_mean"] == pytest.approx(750.0)
    # makespan: first sent 0.0 to last finished 7.0; 3 ok requests, 7 output tokens, 2 within the SLO
    assert m["perf/throughput_req_s"] == pytest.approx(3 / 7)
    assert m["perf/throughput_out_tok_s"] == pytest.approx(7 / 7)
    assert m["perf/goodput_req_s"] == pytest.approx(2 / 7)
    # lateness over the sent requests: 0, 0.5, 0, 0 -> p50 0
    assert m["perf/lateness_ms_p50"] == pytest.approx(0.0)


def test_percentiles_linear_interpolation():
    s = summarize([0.001 * i for i in range(1, 101)], "x")  # 1..100 ms
    assert s["x_ms_p50"] == pytest.approx(50.5)
    assert s["x_ms_p99"] == pytest.approx(99.01)
    assert s["x_ms_p999"] == pytest.approx(99.901)
    assert s["x_ms_mean"] == pytest.approx(50.5)


def test_slo_rejects_nonpositive():
    with pytest.raises(ValueError, match="e2e_s"):
        SLO(e2e_s=0)


def test_no_records_no_throughput():
    m = compute_metrics([])
    assert m["perf/requests_ok"] == 0 and "perf/throughput_req_s" not in m and not math.isnan(m["perf/makespan_s"])


def test_slo_bounds_each_on_its_own_measure():
    """A request fast to its first token but long overall meets a TTFT bound; one slow to start does not."""
    slo = SLO(e2e_s=3.0, ttft_s=0.5)
    quick_start = rec("a", 0.0, 0.0, [0.2, 1.0, 2.0])  # TTFT 0.2, E2E 2.0, TPOT 0.9
    slow_start = rec("b", 0.0, 0.0, [0.8, 0.9, 1.0])    # TTFT 0.8, E2E 1.0
    assert slo.met_by(quick_start) and not slo.met_by(slow_start)
    assert SLO(e2e_s=3.0, tpot_s=1.0).met_by(quick_start) and not SLO(e2e_s=3.0, tpot_s=0.8).met_by(quick_start)
    assert not SLO(e2e_s=1.5).met_by(quick_start) and not slo.met_by(rec("c", 0.0, 0.0, [0.1], ok=False))


def test_lateness_counts_every_sent_request_failed_ones_too():
    """The driver was late sending a request whatever the engine then did with it."""
    ok = [rec(f"r{i}", float(i), float(i), [i + 1.0]) for i in range(9)]  # on time
    late_and_failed = rec("late", 9.0, 9.4, [], ok=False)  # sent 400 ms late, then refused
    m = compute_metrics([*ok, late_and_failed])
    assert m["perf/lateness_ms_p99"] == pytest.approx(percentile([0.0] * 9 + [400.0], 99))
    assert m["perf/lateness_ms_p99"] > 300
    assert "364 ms" in lateness_warning([*ok, late_and_failed], warn_ms=50)  # 0.91 of the way to 400
    assert lateness_warning(ok, warn_ms=50) is None


def test_one_percentile_definition():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)  # linear between the two middle ranks
    assert percentile([1.0, 2.0, math.inf], 50) == 2.0  # an infinite value: an observed one, never nan
    assert percentile([1.0, 2.0, math.inf], 99) == math.inf
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_slo_bounds_are_inclusive():
    r = rec("a", 0.0, 0.0, [0.5, 1.5, 2.5])  # TTFT 0.5, E2E 2.5, TPOT 1.0
    assert SLO(e2e_s=2.5, ttft_s=0.5, tpot_s=1.0).met_by(r)


def test_lateness_warning_boundary_units_and_default_wording():
    recs = [rec(f"r{i}", 0.0, 0.05, [1.0]) for i in range(3)]  # each sent 50 ms late
    assert lateness_warning(recs, warn_ms=50) is None  # at the bound is not beyond it
    assert lateness_warning(recs, warn_ms=49) == ("p99 replay lateness 50 ms exceeds 49 ms: the driver, not the "
                                                  "engine, is being measured")
    assert lateness_warning(recs, 49, who="client").startswith("p99 replay lateness 50 ms exceeds 49 ms: the client")
    assert lateness_warning([RequestRecord("u", 0.0, 1, 1)], warn_ms=1) is None  # nothing sent: nothing late


def test_makespan_runs_from_the_first_send_to_the_last_finish():
    from optladder.traffic.metrics import makespan

    assert makespan([rec("a", 0.0, 2.0, [3.0]), rec("b", 0.0, 2.5, [4.0])]) == pytest.approx(2.0)
    assert makespan([RequestRecord("u", 0.0, 1, 1, sent_at=1.0)]) == 0.0  # sent, never finished
    m = compute_metrics([rec("a", 0.0, 0.0, [0.2, 0.5])])  # a makespan under one second still has throughput
    assert m["perf/throughput_req_s"] == pytest.approx(2.0) and m["perf/makespan_s"] == pytest.approx(0.5)
