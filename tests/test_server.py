"""The reference engine's OpenAI-compatible server, over real HTTP, with the tiny random model."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.llm_engine import LLMEngine
from optladder.serving.server import serve

TINY = ModelConfig(name="tiny", source="random", package=None, gguf_file=None, tokenizer="smollm2",
                   hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=16384)
MAX_LEN = 256


def tiny_engine() -> LLMEngine:
    return LLMEngine(TINY, EngineConfig(device="cpu", max_model_len=MAX_LEN, kv_cache_gb=0.05))


@pytest.fixture(scope="module")
def server():
    engine = tiny_engine()
    with serve(engine, model_name="tiny") as handle:
        yield handle


def post(url: str, body, raw: bytes | None = None, headers: dict | None = None):
    """(status, parsed JSON body) or, for an SSE stream, (status, list of event payloads as they came)."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            if r.headers.get("Content-Type", "").startswith("text/event-stream"):
                events = [line[len(b"data: "):].strip() for line in r if line.startswith(b"data: ")]
                return r.status, [e.decode() if e == b"[DONE]" else json.loads(e) for e in events]
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def completions(server, **body):
    return post(server.url + "/v1/completions", {"model": "tiny", "temperature": 0.0, **body})


def test_health_and_models(server):
    assert server.url.startswith("http://127.0.0.1:")
    assert get(server.url + "/health") == (200, {"status": "ok"})
    status, models = get(server.url + "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == MAX_LEN
    assert get(server.url + "/v1/nothing")[0] == 404


def test_stream_gives_exactly_max_tokens_and_keeps_token_id_prompts_exact(server):
    ids = list(range(1000, 1037))  # 37 ids that would not survive a decode/encode round trip unchanged
    status, events = completions(server, prompt=ids, max_tokens=9, ignore_eos=True, min_tokens=9, stream=True,
                                 stream_options={"include_usage": True})
    assert status == 200 and events[-1] == "[DONE]"
    tokens = [e for e in events[:-1] if e["choices"]]
    assert len(tokens) == 9
    assert [t["choices"][0]["finish_reason"] for t in tokens] == [None] * 8 + ["length"]
    usage = events[-2]["usage"]
    assert events[-2]["choices"] == []
    assert usage == {"prompt_tokens": 37, "completion_tokens": 9, "total_tokens": 46}


def test_stream_and_whole_response_agree_greedily(server):
    body = dict(prompt=[5, 6, 7, 8, 9, 10], max_tokens=6, ignore_eos=True)
    _, events = completions(server, stream=True, **body)
    status, whole = completions(server, **body)
    assert status == 200 and whole["object"] == "text_completion"
    assert whole["choices"][0]["text"] == "".join(e["choices"][0]["text"] for e in events[:-1])
    assert whole["usage"]["completion_tokens"] == 6
    assert "usage" not in events[-2]  # only with stream_options.include_usage, as vLLM does


def test_text_prompt_is_tokenized(server):
    tok = server.tokenizer
    text = "Replay real traffic with its real lengths."
    status, out = completions(server, prompt=text, max_tokens=3)
    assert status == 200 and out["usage"]["prompt_tokens"] == len(tok.encode(text))


def test_too_long_prompt_is_refused_with_the_reason(server):
    for stream in (False, True):
        status, err = completions(server, prompt=[7] * 250, max_tokens=10, stream=stream)
        assert status == 400
        assert "maximum context length is 256" in err["error"]["message"]
        assert "250 in the prompt" in err["error"]["message"]
    assert completions(server, prompt=[7] * 246, max_tokens=10)[0] == 200  # exactly max_model_len fits


def test_chat_goes_through_the_chat_template(server):
    tok = server.tokenizer
    messages = [{"role": "user", "content": "What is paged attention?"}]
    want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    want = len(want["input_ids"] if hasattr(want, "keys") else want)
    url = server.url + "/v1/chat/completions"
    status, out = post(url, {"messages": messages, "max_tokens": 4, "ignore_eos": True, "temperature": 0})
    assert status == 200 and out["object"] == "chat.completion"
    assert out["usage"]["prompt_tokens"] == want and out["usage"]["completion_tokens"] == 4
    assert out["choices"][0]["message"]["role"] == "assistant"
    status, events = post(url, {"messages": messages, "max_tokens": 4, "ignore_eos": True, "temperature": 0,
                                "stream": True})
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"]["content"] for e in events[1:-1]) == out["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body, status, match", [
    (None, 400, "not JSON"),
    ({"prompt": [1, 2], "model": "gpt-9"}, 404, "does not exist"),
    ({"prompt": [1, 49152]}, 400, "outside the vocabulary"),
    ({"prompt": [[1, 2], [3]]}, 400, "one prompt per request"),
    ({"prompt": [1, 2], "n": 2}, 400, "n=2 is not supported"),
    ({"prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens must be >= 1"),
    ({"prompt": [1, 2], "max_tokens": 8, "min_tokens": 4}, 400, "ignore_eos"),
    ({"prompt": [1, 2], "temperature": -1}, 400, "temperature"),
    ({"prompt": [1, 2], "stream": "yes"}, 400, "stream must be true or false"),
])
def test_bad_requests_name_what_is_wrong(server, body, status, match):
    got, err = post(server.url + "/v1/completions", body, raw=b"{not json" if body is None else None)
    assert got == status and match in err["error"]["message"]


def test_concurrent_streams_are_served_together(server):
    results = {}

    def one(i):
        results[i] = completions(server, prompt=[100 + i] * (10 + i), max_tokens=5 + i, ignore_eos=True,
                                 stream=True, stream_options={"include_usage": True})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i, (status, events) in results.items():
        assert status == 200 and events[-2]["usage"]["completion_tokens"] == 5 + i
        assert events[-2]["usage"]["prompt_tokens"] == 10 + i
    assert len(results) == 6


class StepFailsAfter:
    """A real engine whose step() raises after `n` steps: what a CUDA error mid-run looks like."""

    def __init__(self, engine, n):
        self.engine, self.n = engine, n

    def step(self):
        self.n -= 1
        if self.n < 0:
            raise RuntimeError("device lost")
        return self.engine.step()

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_an_engine_failure_reaches_every_client_and_health():
    with serve(StepFailsAfter(tiny_engine(), 4), model_name="tiny") as handle:
        status, events = post(handle.url + "/v1/completions",
                              {"prompt": [3] * 8, "max_tokens": 20, "ignore_eos": True, "stream": True})
        assert status == 200 and "[DONE]" not in events
        assert "device lost" in events[-1]["error"]["message"]
        assert len(events) - 1 < 20
        assert get(handle.url + "/health")[0] == 503
        status, err = post(handle.url + "/v1/completions", {"prompt": [3] * 8, "max_tokens": 2})
        assert status == 503 and "device lost" in err["error"]["message"]
