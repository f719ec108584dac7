"""Soak mode: its gates on synthetic numbers with known answers (each gate must be able to fail), the looped
schedule, and one short soak end to end (model=tiny, HTTP, bad requests mixed in, the stdlib client)."""
from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from optladder.abtest.soak import Sample, SoakConfig, decide, windows
from optladder.experiments.soak_core import bad_schedule, looped
from optladder.experiments.soak_run import run_soak
from tests.conftest import compose_config
from optladder.traffic.bad_requests import EXPECTED, KINDS
from optladder.traffic.request import Request

CFG = SoakConfig(duration_min=10, window_s=60, warmup_min=2, max_mem_slope_mib_min=1.0, max_p999_ratio=1.5)


def samples(slope_mib_min: float, minutes: int = 10) -> list[Sample]:
    return [Sample(t, 500 + slope_mib_min * t / 60, 300 + slope_mib_min * t / 60, None, 4, 96)
            for t in range(0, minutes * 60, 5)]


def good(n_per_min: int = 20, minutes: int = 10, e2e_s=lambda minute: 1.0) -> list[dict]:
    out = []
    for m in range(minutes):
        for i in range(n_per_min):
            sent = m * 60 + i * (60 / n_per_min)
            out.append({"sent_at": sent, "first_token_at": sent + 0.1, "finished_at": sent + e2e_s(m) * (1 + i / 100),
                        "scheduled_at": sent, "output_tokens": 10, "ok": True, "error": None})
    return out


def bad(kinds=KINDS, status=None) -> list[dict]:
    return [{"kind": k, "sent_at": 30.0 * i, "expected": EXPECTED[k], "status": status or EXPECTED[k],
             "ok": (status or EXPECTED[k]) == EXPECTED[k], "detail": ""} for i, k in enumerate(kinds)]


def verdict(**kw) -> dict[str, str]:
    args = dict(samples=samples(0.0), good=good(), bad=bad(), kv_free=True, aborted=1, sent_good=None,
                sent_bad=None)
    args.update(kw)
    g, b = args["good"], args["bad"]
    wins = windows(g, b, args["samples"], CFG.window_s, 600)
    gates = decide(CFG, wins, args["samples"], args["sent_good"] or len(g), args["sent_bad"] or len(b), g, b,
                   args["kv_free"], args["aborted"], 600)
    return {x.name.split(":")[0]: x.status for x in gates}


def test_a_healthy_soak_passes_every_gate():
    assert set(verdict().values()) == {"pass"}


@pytest.mark.parametrize("change, gate", [
    (dict(samples=samples(2.0)), "memory"),  # 2 MiB a minute: a leak
    (dict(kv_free=False), "kv_leak"),
    (dict(good=good(e2e_s=lambda m: 1.0 if m < 9 else 2.0)), "p999_stability"),  # the last window doubles
    (dict(sent_good=len(good()) + 1), "lost_records"),
    (dict(sent_bad=len(KINDS) + 1), "lost_records"),
    (dict(good=[{**r, "ok": i != 5, "error": "HTTP 503" if i == 5 else None} for i, r in enumerate(good())]),
     "good_requests"),
    (dict(bad=bad(status=500)), "bad_requests"),
    (dict(aborted=0), "bad_requests"),  # a client hung up and its sequence was not aborted
])
def test_each_gate_fails_on_its_own_fault(change, gate):
    v = verdict(**change)
    assert v[gate] == "fail", v
    assert all(s == "pass" for g, s in v.items() if g != gate), v


def test_windows_hold_percentiles_and_kv_extremes():
    s = samples(0.0, 2)
    s[3].kv_used_blocks, s[4].kv_free_blocks = 50, 7
    w = windows(good(minutes=2), bad(), s, 60, 120)
    assert [x.requests for x in w] == [20, 20] and w[0].kv_used_blocks == 50 and w[0].kv_free_blocks == 7
    assert w[0].latency_ms["e2e_p50"] == pytest.approx(1095, rel=0.01)
    assert sum(w[0].bad.values()) == 2 and w[0].anon_mib == pytest.approx(300)


def test_the_loop_keeps_the_workloads_timing_and_bad_kinds_take_turns():
    reqs = [Request(f"r{i}", [5, 6], 4, scheduled_at=2.0 * i) for i in range(4)]  # 0, 2, 4, 6 s: one every 2 s
    out = looped(reqs, 20.0)
    assert [r.scheduled_at for r in out] == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    assert len({r.id for r in out}) == len(out) and out[4].id == "r0.1"
    plan = bad_schedule(1000, 600.0, 0.05, seed=1)
    assert 30 < len(plan) < 75  # 5% of all requests, about 1000 * 0.05 / 0.95
    assert [k for _, k in plan[:len(KINDS)]] == list(KINDS) and all(t < 600 for t, _ in plan)


@pytest.mark.e2e
def test_a_short_soak_end_to_end(tmp_path, one_torch_thread):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    over = [f"tracking.uri={uri}", "+soak=smoke", "soak.duration_min=0.4", "soak.window_s=8", "soak.warmup_min=0.1",
            "soak.client=threads", "soak.bad_request_rate=0.25", "soak.max_p999_ratio=100",
            "soak.max_mem_slope_mib_min=1000", "engine.paged_kv=true", "engine.dynamic_batching=true",
            "workload.rate=4"]
    code = run_soak(compose_config(over), tmp_path / "run", over, {})
    report = json.loads((tmp_path / "run" / "soak.json").read_text())
    gates = {g["name"]: g["status"] for g in report["gates"]}
    assert code == (0 if report["verdict"] == "pass" else 1)
    # these hold whatever the machine's load does to the timing (p99.9 stability is the one that may not)
    for name in ("kv_leak", "lost_records", "good_requests", "bad_requests", "memory:anon_mib"):
        assert gates[name] == "pass", report["gates"]
    kinds = {b["kind"] for b in report["bad_by_kind"]}
    assert {"malformed_json", "wrong_key", "oversized_body"} <= kinds
    assert len((tmp_path / "run" / "requests.jsonl").read_text().splitlines()) == report["requests"]
    assert (tmp_path / "run" / "soak.png").stat().st_size > 0
    client = MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("optladder").experiment_id])[0]
    assert run.data.tags["verdict"] == report["verdict"] and run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "soak/anon_mib")) == len(report["windows"])
    assert "soak.png" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_every_soak_config_composes():
    from omegaconf import OmegaConf

    from tests.conftest import CONF

    names = sorted(p.stem for p in (CONF / "soak").glob("*.yaml"))
    assert "cpu" in names
    for name in names:
        soak = OmegaConf.to_object(compose_config([f"+soak={name}"])).soak
        assert isinstance(soak, SoakConfig) and soak.name == name
