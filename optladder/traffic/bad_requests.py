"""Bad requests at the HTTP edge, the kinds a server meets in production, each with the answer it must get:

| kind | what is sent | expected |
|---|---|---|
| malformed_json | a body cut mid-object | 400 |
| too_long | a prompt of max_model_len token ids | 400 |
| max_tokens_zero / max_tokens_huge | max_tokens 0 / 10^9 | 400 |
| unknown_model | model "no-such-model" | 404 |
| wrong_key / missing_key | a wrong bearer token / none (the server has a key) | 401 |
| oversized_body | a body one byte over the server's limit | 413 |
| disconnect | a good stream, closed after its first event | 200, then the server aborts it |

`send_bad(kind, ...)` sends one over a raw socket (so a body can be cut, or a client can vanish) and
returns a BadRecord: what came back and whether it was the expected answer. Never raises for the server's
behaviour: a reset or a timeout is recorded as the answer.
"""
from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlparse

KINDS = ("malformed_json", "too_long", "max_tokens_zero", "max_tokens_huge", "unknown_model", "wrong_key",
         "missing_key", "oversized_body", "disconnect")
EXPECTED = {"malformed_json": 400, "too_long": 400, "max_tokens_zero": 400, "max_tokens_huge": 400,
            "unknown_model": 404, "wrong_key": 401, "missing_key": 401, "oversized_body": 413, "disconnect": 200}


@dataclass
class BadRecord:
    kind: str
    sent_at: float  # seconds since the soak's start
    expected: int
    status: int | None  # None: no status line came back (reset, timeout)
    ok: bool  # the expected answer
    detail: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class Target:
    base_url: str
    model: str
    api_key: str | None
    max_model_len: int
    max_body_bytes: int
    timeout_s: float = 30.0


def _body(kind: str, t: Target) -> bytes:
    good = {"model": t.model, "prompt": [11, 12, 13, 14], "max_tokens": 4}
    if kind == "malformed_json":
        return b'{"model": "' + t.model.encode() + b'", "prompt": [1, 2'
    if kind == "too_long":
        return json.dumps({**good, "prompt": [11] * t.max_model_len}).encode()
    if kind == "max_tokens_zero":
        return json.dumps({**good, "max_tokens": 0}).encode()
    if kind == "max_tokens_huge":
        return json.dumps({**good, "max_tokens": 10 ** 9}).encode()
    if kind == "unknown_model":
        return json.dumps({**good, "model": "no-such-model"}).encode()
    if kind == "oversized_body":
        pad = t.max_body_bytes + 1 - len(json.dumps({**good, "user": ""}))
        return json.dumps({**good, "user": "x" * max(pad, 1)}).encode()
    if kind == "disconnect":  # long enough to be running when its client leaves
        return json.dumps({**good, "max_tokens": max(8, min(256, t.max_model_len // 2)), "ignore_eos": True,
                           "stream": True}).encode()
    return json.dumps(good).encode()


def _head(kind: str, t: Target, length: int) -> bytes:
    url = urlparse(t.base_url)
    lines = ["POST /v1/completions HTTP/1.1", f"Host: {url.netloc}", "Content-Type: application/json",
             f"Content-Length: {length}", "Connection: close"]
    key = {"wrong_key": "not-the-key", "missing_key": None}.get(kind, t.api_key)
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def send_bad(kind: str, t: Target, sent_at: float) -> BadRecord:
    if kind not in EXPECTED:
        raise ValueError(f"bad request kind {kind!r} is not one of {list(KINDS)}")
    body = _body(kind, t)
    url = urlparse(t.base_url)
    status, detail = None, ""
    try:
        with socket.create_connection((url.hostname, url.port), timeout=t.timeout_s) as s:
            try:
                s.sendall(_head(kind, t, len(body)) + body)
            except (BrokenPipeError, ConnectionResetError):  # answered before the body was all sent
                pass
            reply = _read_head(s)
            status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.") else None
            detail = reply.split(b"\r\n\r\n", 1)[-1][:200].decode(errors="replace")
            # disconnect: the first event is in (or the stream failed): hang up now, mid-stream
    except OSError as e:
        detail = f"{type(e).__name__}: {e}"
    expected = EXPECTED[kind]
    return BadRecord(kind, sent_at, expected, status, status == expected, detail)


def _read_head(s: socket.socket, limit: int = 1 << 16) -> bytes:
    """The status line, headers and what came with them (a stream's first event, an error body)."""
    data = b""
    deadline = time.monotonic() + s.gettimeout()
    while b"\r\n\r\n" not in data or data.endswith(b"\r\n\r\n"):
        if time.monotonic() > deadline or len(data) > limit:
            break
        part = s.recv(4096)
        if not part:
            break
        data += part
    return data
