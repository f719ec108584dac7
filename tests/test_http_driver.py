"""The locust HTTP driver against the reference server (tiny random model): records, timing, and failure."""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_server import MAX_LEN, TINY, tiny_engine

from optladder.engine.config import EngineConfig
from optladder.serving.server import serve
from optladder.backends.engines import ReferenceBackend
from optladder.traffic.arrivals import poisson_arrivals
from optladder.traffic.http_driver import replay_http
from optladder.traffic.metrics import compute_metrics
from optladder.traffic.replay_config import Pacing, ReplayConfig
from optladder.traffic.request import Request
from optladder.traffic.sse import TokenStream, completion_payload

ROOT = Path(__file__).resolve().parents[1]
QUIET = ReplayConfig(progress=False)


def make_requests(n: int, rate: float | None, out_range=(3, 12), seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    times = poisson_arrivals(n, rate, seed) if rate else [0.0] * n
    return [Request(f"req-{i:03d}", [rng.randrange(300, 40000) for _ in range(rng.randrange(8, 80))],
                    rng.randrange(*out_range), scheduled_at=t, prompt=f"Question {i}: what is a KV cache?")
            for i, t in enumerate(times)]


@pytest.fixture(scope="module")
def server():
    with serve(tiny_engine(), model_name="tiny") as handle:
        yield handle


def test_open_loop_replay_keeps_the_schedule(server):
    reqs = make_requests(16, rate=8.0)
    seen = []
    records = replay_http(reqs, server.url, "tiny", QUIET, Pacing("open"), seen.append)
    assert [r.id for r in records] == [r.id for r in reqs] and sorted(r.id for r in seen) == sorted(r.id for r in reqs)
    for req, rec in zip(reqs, records):
        assert rec.ok, rec.error
        assert rec.input_tokens == req.input_len and rec.output_tokens == req.output_len
        assert len(rec.token_times) == req.output_len  # one streamed chunk per token, each timed
        assert 0 < rec.ttft < rec.e2e
        assert rec.scheduled_at == req.scheduled_at
        assert 0 <= rec.lateness < 0.5  # sent at its time, not all at once and not far behind
    m = compute_metrics(records)
    assert m["perf/requests_ok"] == 16 and "perf/lateness_ms_p99" in m
    assert max(r.sent_at for r in records) > 0.5 * reqs[-1].scheduled_at  # spread like the schedule


def test_closed_loop_keeps_concurrency_in_flight(server):
    reqs = make_requests(12, rate=None, out_range=(6, 10))
    records = replay_http(reqs, server.url, "tiny", QUIET, Pacing("closed", 3))
    assert all(r.ok for r in records)
    edges = sorted([(r.sent_at, 1) for r in records] + [(r.finished_at, -1) for r in records],
                   key=lambda e: (e[0], e[1]))
    level, peak = 0, 0
    for _, d in edges:
        level += d
        peak = max(peak, level)
    assert peak == 3
    assert all(0 <= r.lateness < 0.5 for r in records)  # closed loop: from the slot freeing to the send


def test_chat_endpoint_replays_too(server):
    reqs = make_requests(4, rate=20.0)
    records = replay_http(reqs, server.url, "tiny",
                          ReplayConfig(endpoint="chat", progress=False), Pacing("open"))
    assert all(r.ok and r.output_tokens == q.output_len for r, q in zip(records, reqs))


def test_requests_the_server_refuses_are_counted_errors(server):
    reqs = make_requests(3, rate=20.0)
    reqs[1] = Request("too-long", [5] * 300, 4, scheduled_at=reqs[1].scheduled_at)
    records = replay_http(reqs, server.url, "tiny", QUIET, Pacing("open"))
    assert [r.ok for r in records] == [True, False, True]
    assert records[1].error.startswith("HTTP 400") and "maximum context length" in records[1].error


def test_backend_replays_over_http_with_the_same_tokens_as_in_process():
    backend = ReferenceBackend(TINY, EngineConfig(device="cpu", max_model_len=MAX_LEN, kv_cache_gb=0.05),
                               driver="locust")
    reqs = make_requests(4, rate=20.0)
    written = []
    over_http = backend.replay(reqs, QUIET, Pacing("open"), written.append)
    assert all(r.ok for r in over_http) and len(written) == 4
    backend.driver = "inprocess"  # the same engine, now stepped by the in-process driver
    in_process = backend.replay(reqs, QUIET, Pacing("open"), lambda r: None)
    assert [r.output_text for r in over_http] == [r.output_text for r in in_process]  # greedy: same tokens
    assert [r.output_tokens for r in over_http] == [r.output_tokens for r in in_process]
    with pytest.raises(ValueError, match="replay.driver='grpc'"):
        ReferenceBackend(TINY, EngineConfig(device="cpu"), driver="grpc")


SERVER_SCRIPT = """
import time
from test_server import tiny_engine
from optladder.serving.server import serve
print(serve(tiny_engine(), model_name="tiny").url, flush=True)
time.sleep(600)
"""


def test_a_server_killed_mid_replay_gives_counted_errors_and_keeps_what_was_done():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, env=env, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        reqs = make_requests(16, rate=6.0, out_range=(20, 40))
        kept = []

        def on_record(rec):
            kept.append(rec)
            if len(kept) == 3:
                proc.send_signal(signal.SIGKILL)

        t0 = time.monotonic()
        cfg = ReplayConfig(request_timeout_s=30, progress=False)
        records = replay_http(reqs, url, "tiny", cfg, Pacing("open"), on_record)
        elapsed = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert len(records) == 16 and len(kept) == 16  # every request accounted for, each reported once
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    assert len(ok) >= 3 and failed, [r.error for r in records]
    assert all(r.error for r in failed)
    assert any("server unreachable" in r.error or "connection failed" in r.error for r in failed)
    assert compute_metrics(records)["perf/requests_failed"] == len(failed)
    assert elapsed < 20  # failed fast: no waiting out the schedule or the 30 s timeout


def test_a_server_that_never_answers_times_out():
    with socket.socket() as sink:  # accepts connections (the kernel does) and never replies
        sink.bind(("127.0.0.1", 0))
        sink.listen(16)
        url = f"http://127.0.0.1:{sink.getsockname()[1]}"
        t0 = time.monotonic()
        cfg = ReplayConfig(request_timeout_s=1.0, progress=False)
        records = replay_http(make_requests(3, rate=20.0), url, "tiny", cfg, Pacing("open"))
    assert time.monotonic() - t0 < 15
    assert all(not r.ok and r.error.startswith("timeout") for r in records)


def test_token_stream_parsing():
    clock = iter([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]).__next__
    s = TokenStream(chat=True, clock=clock)
    for line in [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}', b"",
                 b'data: {"choices":[{"delta":{"content":"Hi"}}]}', b": keep-alive",
                 b'data: {"choices":[{"delta":{"content":""}}]}',
                 b'data: {"choices":[],"usage":{"completion_tokens":3}}', b"data: [DONE]"]:
        s.feed(line)
    assert s.token_times == [0.2, 0.3] and s.done and s.finished_at == 0.5
    from optladder.traffic.request import RequestRecord
    rec = RequestRecord("a", 0.0, 4, 3, sent_at=0.0)
    s.fill(rec)
    assert rec.ok and rec.output_tokens == 3 and rec.first_token_at == 0.2 and rec.output_text == "Hi"
    cut = TokenStream(chat=False, clock=lambda: 1.0)
    cut.feed(b'data: {"choices":[{"text":"x"}]}')
    rec = RequestRecord("b", 0.0, 4, 3, sent_at=0.0)
    cut.fill(rec)
    assert not rec.ok and "without [DONE]" in rec.error and rec.output_tokens == 1 and rec.finished_at is None


def test_payload_sends_token_ids_and_asks_for_exact_lengths():
    r = {"id": "a", "prompt_token_ids": [9, 8, 7], "output_len": 5, "prompt": "x", "ignore_eos": True}
    body = completion_payload(r, "tiny", chat=False)
    assert body["prompt"] == [9, 8, 7] and body["max_tokens"] == body["min_tokens"] == 5 and body["ignore_eos"]
    assert body["stream_options"] == {"include_usage": True}
    assert completion_payload(r, "tiny", chat=True)["messages"] == [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("make, match", [
    (lambda: Pacing(mode="poisson"), "mode='poisson'"), (lambda: Pacing(concurrency=0), "concurrency"),
    (lambda: ReplayConfig(endpoint="embeddings"), "replay.endpoint='embeddings'.*completions"),
    (lambda: ReplayConfig(request_timeout_s=0), "replay.request_timeout_s"),
    (lambda: ReplayConfig(max_users=0), "replay.max_users"), (lambda: ReplayConfig(driver="grpc"), "inprocess")])
def test_bad_config_is_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_sent_at_is_when_the_client_really_sent(server):
    """One locust user and every request due at once: each is sent only when the one before it has finished, so
    its lateness (sent_at - scheduled_at) is at least that one's finish time, measured on the same clock."""
    reqs = [Request(f"late-{i}", list(range(300, 340)), 6, scheduled_at=0.0, prompt="late") for i in range(4)]
    records = replay_http(reqs, server.url, "tiny", ReplayConfig(progress=False, max_users=1), Pacing("open"))
    assert all(r.ok for r in records), [r.error for r in records]
    for prev, rec in zip(records, records[1:]):
        assert rec.scheduled_at == 0.0
        assert rec.lateness >= prev.finished_at > prev.sent_at >= 0.0
        assert rec.first_token_at > rec.sent_at  # TTFT from the real send, not from the schedule
    assert records[-1].lateness > 0.0
