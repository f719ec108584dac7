"""Load levels on plain data: the schedules each level sends, the per-level metrics, the Pareto frontier."""
from __future__ import annotations

import pytest

from optladder.experiments.load_curves import pareto_frontier, points, write_load_curves
from optladder.traffic.arrivals import gamma_arrivals, poisson_arrivals
from optladder.traffic.load_levels import level_metrics, plan_levels
from optladder.traffic.request import Request, RequestRecord


def requests(times: list[float]) -> list[Request]:
    return [Request(f"r{i}", [1, 2, 3], 4, scheduled_at=t) for i, t in enumerate(times)]


def test_a_rate_level_is_the_schedule_drawn_at_that_rate():
    base = poisson_arrivals(50, 2.0, seed=4)
    for level in (0.5, 8.0):
        got = [r.scheduled_at for r in plan_levels(requests(base), [level], "poisson", 1.0, 2.0)[0].requests]
        assert got == pytest.approx(poisson_arrivals(50, level, seed=4))
    g = gamma_arrivals(50, 2.0, 3.0, seed=4)
    got = [r.scheduled_at for r in plan_levels(requests(g), [6.0], "gamma", 1.0, 2.0)[0].requests]
    assert got == pytest.approx(gamma_arrivals(50, 6.0, 3.0, seed=4))


def test_trace_levels_are_time_scales_and_closed_levels_concurrencies():
    base = [0.0, 1.0, 3.0]  # already replayed at time_scale 2
    half, slow = plan_levels(requests(base), [1.0, 4.0], "trace", 2.0, 99.0)
    assert [r.scheduled_at for r in half.requests] == [0.0, 0.5, 1.5]
    assert [r.scheduled_at for r in slow.requests] == [0.0, 2.0, 6.0]
    assert (half.knob, half.index, slow.index) == ("workload.time_scale", 0, 1)
    closed = plan_levels(requests(base), [1, 8], "closed", 1.0, 1.0)
    assert [(p.mode, p.concurrency) for p in closed] == [("closed", 1), ("closed", 8)]
    with pytest.raises(ValueError, match="whole number"):
        plan_levels(requests(base), [2.5], "closed", 1.0, 1.0)
    with pytest.raises(ValueError, match="> 0"):
        plan_levels(requests(base), [0], "poisson", 1.0, 1.0)


def record(i: int, sent: float, done: float, tokens: int) -> RequestRecord:
    return RequestRecord(f"r{i}", sent, 3, tokens, sent_at=sent, first_token_at=sent + 0.5, finished_at=done,
                         output_tokens=tokens, token_times=[sent + 0.5, done], ok=True)


def test_per_user_throughput_is_throughput_over_requests_in_flight():
    # two requests, each in flight for 2 s of a 3 s makespan: 4/3 in flight on average; 30 tokens in 3 s
    m = level_metrics([record(0, 0.0, 2.0, 10), record(1, 1.0, 3.0, 20)], gpus=2)
    assert m["load/throughput_out_tok_s"] == pytest.approx(10.0)
    assert m["load/mean_in_flight"] == pytest.approx(4 / 3)
    assert m["load/out_tok_s_per_user"] == pytest.approx(7.5)
    assert m["load/out_tok_s_per_gpu"] == pytest.approx(5.0)
    assert m["load/requests_ok"] == 2 and "load/e2e_ms_p99" in m


def level(i: int, user: float, gpu: float) -> dict:
    return {"index": i, "knob": "workload.rate", "value": float(i + 1),
            "metrics": {"load/out_tok_s_per_user": user, "load/out_tok_s_per_gpu": gpu,
                        "load/throughput_out_tok_s": gpu, "load/e2e_ms_p99": 100.0 * (i + 1)}}


def test_pareto_frontier_keeps_only_undominated_points(tmp_path):
    curves = {"a": [level(0, 10, 100), level(1, 5, 300)], "b": [level(0, 8, 90), level(1, 4, 350), level(2, 1, 340)]}
    front = pareto_frontier(points(curves))
    assert [(p["config"], p["per_user"], p["per_gpu"]) for p in front] == [("b", 4, 350), ("a", 5, 300), ("a", 10, 100)]
    written = write_load_curves(curves, tmp_path)
    assert {p.name for p in written} == {"pareto.json", "pareto.md", "load_curves.png"}
    assert "| b | workload.rate=2 | 4 | 350 |" in (tmp_path / "pareto.md").read_text()
    assert write_load_curves({"c": []}, tmp_path / "none") == []


def test_level_plans_are_whole():
    from optladder.traffic.load_levels import LevelPlan

    reqs = requests([0.0, 1.0])
    assert plan_levels(reqs, [2, 3], "closed", 1.0, 1.0) == [
        LevelPlan(0, 2.0, "workload.concurrency", reqs, "closed", 2),
        LevelPlan(1, 3.0, "workload.concurrency", reqs, "closed", 3)]
    assert plan_levels(reqs, [4], "poisson", 1.0, 2.0) == [
        LevelPlan(0, 4.0, "workload.rate", requests([0.0, 0.5]), "open", 1)]


@pytest.mark.parametrize("levels, arrival, msg", [
    ([1.0], "uniform", "workload.arrival='uniform' is not one of ['trace', 'poisson', 'gamma', 'closed']"),
    ([True], "poisson", "replay.load_levels: each level must be a number > 0, got True"),
    ([float("inf")], "poisson", "replay.load_levels: each level must be a number > 0, got inf"),
])
def test_bad_levels_are_refused_whole(levels, arrival, msg):
    with pytest.raises(ValueError) as e:
        plan_levels(requests([0.0]), levels, arrival, 1.0, 1.0)
    assert str(e.value) == msg


def test_level_metrics_edges():
    from optladder.traffic.metrics import SLO

    recs = [record(0, 0.0, 2.0, 10), record(1, 1.0, 3.0, 20)]
    assert level_metrics(recs)["load/out_tok_s_per_gpu"] == pytest.approx(10.0)  # one GPU by default
    assert level_metrics(recs, SLO(e2e_s=1.5))["load/goodput_req_s"] == 0.0  # the SLO is the one given
    assert level_metrics(recs)["load/goodput_req_s"] == pytest.approx(2 / 3)
    failed = RequestRecord("f", 0.0, 3, 4, sent_at=0.0, finished_at=100.0, ok=False)  # not in flight: failed
    assert level_metrics(recs + [failed])["load/mean_in_flight"] == pytest.approx(4 / 3)
    # a 0.5 s makespan: in flight 1.0 on average, 20 tok/s per user
    short = level_metrics([record(0, 0.0, 0.5, 10)])
    assert short["load/mean_in_flight"] == pytest.approx(1.0) and short["load/out_tok_s_per_user"] == pytest.approx(20.0)
    none = level_metrics([failed])
    assert none["load/mean_in_flight"] == 0.0 and none["load/out_tok_s_per_user"] == 0.0
    assert none["load/out_tok_s_per_gpu"] == 0.0
