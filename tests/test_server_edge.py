"""Bad input at the HTTP edge: each kind gets its own status with the reason, a client that leaves has its
sequence aborted, and the engine keeps serving with every KV block back in the pool."""
from __future__ import annotations

import json
import socket
import time

import pytest
from test_server import TINY, get, post

from optladder.engine.config import EngineConfig
from optladder.engine.llm_engine import LLMEngine
from optladder.serving.server import serve

KEY = "s3cret-key"
LIMIT = 64 << 10  # a small body limit, so an oversized body is cheap to send


class SlowSteps:
    """A real engine whose steps take at least `delay_s`: a long request is still running when its client
    leaves, however fast the machine."""

    def __init__(self, engine, delay_s: float):
        self.engine, self.delay_s = engine, delay_s

    def step(self):
        time.sleep(self.delay_s)
        return self.engine.step()

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(TINY, EngineConfig(device="cpu", max_model_len=256, kv_cache_gb=0.05, paged_kv=True,
                                        dynamic_batching=True))


@pytest.fixture(scope="module")
def server(engine):
    with serve(SlowSteps(engine, 0.01), model_name="tiny", api_key=KEY, max_body_bytes=LIMIT) as handle:
        yield handle


def ask(server, body=None, key=KEY, raw=None, path="/v1/completions"):
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return post(server.url + path, body, raw=raw, headers=headers)


def wait_idle(engine, loop, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished() or loop.busy():
        assert time.monotonic() < deadline, "the engine never went idle"
        time.sleep(0.02)


def test_api_key_is_required_and_compared(server):
    good = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}
    assert ask(server, good)[0] == 200
    for key in (None, "wrong", KEY + "x", ""):
        status, err = ask(server, good, key=key)
        assert status == 401 and "Authorization: Bearer" in err["error"]["message"], key
    status, err = post(server.url + "/v1/completions", good, headers={"Authorization": f"Basic {KEY}"})
    assert status == 401
    assert get(server.url + "/health")[0] == 200  # probes need no key
    assert get(server.url + "/v1/models")[0] == 401


@pytest.mark.parametrize("body, raw, status, match", [
    (None, b"{not json", 400, "not JSON"),
    (None, b"[" * 20_000 + b"]" * 20_000, 400, "nested too deeply"),
    (None, b"\xff\xfe{}", 400, "not JSON"),
    (None, b'"a string"', 400, "must be a JSON object"),
    ({"model": "gpt-9", "prompt": [1, 2]}, None, 404, "does not exist"),
    ({"prompt": [7] * 250, "max_tokens": 10}, None, 400, "maximum context length is 256"),
    ({"prompt": [1, 2], "max_tokens": 0}, None, 400, "max_tokens must be >= 1"),
    ({"prompt": [1, 2], "max_tokens": -5}, None, 400, "max_tokens must be >= 1"),
    ({"prompt": [1, 2], "max_tokens": 10 ** 12}, None, 400, "maximum context length"),
    (None, b'{"prompt": [1, 2], "max_tokens": 1e999}', 400, "max_tokens must be an integer"),
    (None, b'{"prompt": [1, 2], "max_tokens": NaN}', 400, "max_tokens must be an integer"),
    ({"prompt": [1, 2], "max_tokens": 2.5}, None, 400, "max_tokens must be an integer"),
    ({"prompt": "x" * (LIMIT + 1)}, None, 413, f"limit of {LIMIT} bytes"),
])
def test_bad_requests_get_the_right_status_and_the_engine_keeps_serving(server, engine, body, raw, status, match):
    got, err = ask(server, body, raw=raw)
    assert got == status and match in err["error"]["message"], err
    ok, out = ask(server, {"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True})
    assert ok == 200 and out["usage"]["completion_tokens"] == 3
    wait_idle(engine, server.loop)
    assert engine.block_manager.all_free()


def test_a_huge_body_is_refused_without_being_kept(server):
    big = b'{"prompt": "' + b"x" * (20 * LIMIT) + b'"}'  # past the drain bound: answered, then closed
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(_request_head(len(big)) + big[:LIMIT * 2])
        try:
            s.sendall(big[LIMIT * 2:])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may stop reading once it has its answer
        head = s.recv(200)
    assert head.startswith(b"HTTP/1.1 413")


def _request_head(length: int, path: str = "/v1/completions") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {length}\r\n\r\n").encode()


def _open(server, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30)
    s.sendall(_request_head(len(data)) + data)
    return s


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_has_its_sequence_aborted(server, engine, stream):
    aborted = server.loop.aborted
    body = {"prompt": [9] * 16, "max_tokens": 200, "ignore_eos": True, "stream": stream}
    s = _open(server, body)
    if stream:
        assert s.recv(4096).startswith(b"HTTP/1.1 200")  # headers and the first token: it is running
    else:
        deadline = time.monotonic() + 30
        while not engine.scheduler.running:  # admitted and decoding; the answer is 200 tokens away
            assert time.monotonic() < deadline
            time.sleep(0.01)
    s.close()
    deadline = time.monotonic() + 30
    while server.loop.aborted == aborted:
        assert time.monotonic() < deadline, "the disconnect never reached the engine"
        time.sleep(0.02)
    wait_idle(engine, server.loop)
    assert engine.block_manager.all_free()
    ok, out = ask(server, {"prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True, "stream": True})
    assert ok == 200 and out[-1] == "[DONE]"  # and the engine keeps serving


def test_finished_streams_are_not_counted_as_aborted(server, engine):
    aborted = server.loop.aborted
    for stream in (True, False):
        assert ask(server, {"prompt": [5, 6], "max_tokens": 3, "stream": stream})[0] == 200
    wait_idle(engine, server.loop)
    assert server.loop.aborted == aborted and engine.block_manager.all_free()


def test_binds_loopback_by_default(server):
    assert server.url.startswith("http://127.0.0.1:")
