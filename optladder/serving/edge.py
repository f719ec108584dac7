"""What a request must show at the edge before the engine sees it, framework-free: the API key, a body of
bounded size that is one JSON object, and whether the client is still there.

Each refusal is a `Refused` carrying its HTTP status and a message that names what was wrong and what is
accepted; optladder/serving/server.py turns it into an OpenAI-style error body.
"""
from __future__ import annotations

import hmac
import json
import select
import socket

from optladder.serving.openai_protocol import BadRequest

MAX_BODY_BYTES = 8 << 20  # a max_model_len prompt as token ids is well under 1 MiB even at 128k tokens
# An oversized body is read to its end (and thrown away) up to this multiple of the limit before the 413:
# a server that answers and closes while the client is still sending resets the connection, and the
# client then sees "connection reset" instead of the status that says what was wrong.
_DRAIN_FACTOR = 8
_CHUNK = 1 << 16


class Refused(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def check_key(authorization: str | None, key: bytes | None) -> None:
    """With a key set, `Authorization: Bearer <key>`, compared in constant time, or 401."""
    if key is None:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key):
        return
    what = "a wrong API key" if given else "no API key"
    raise Refused(401, f"{what}: send the header 'Authorization: Bearer <key>'", "authentication_error")


def read_body(rfile, content_length: str | None, max_bytes: int) -> bytes:
    """The request body, at most `max_bytes` of it (413 beyond, after draining what the client sends)."""
    if content_length is None or not content_length.strip().isdigit():
        raise Refused(411 if content_length is None else 400,
                      f"Content-Length {content_length!r} is not a number of bytes" if content_length is not None
                      else "a request body needs a Content-Length header")
    length = int(content_length)
    if length <= max_bytes:
        return rfile.read(length)
    left = min(length, _DRAIN_FACTOR * max_bytes)
    while left > 0:
        got = rfile.read(min(_CHUNK, left))
        if not got:
            break
        left -= len(got)
    raise Refused(413, f"request body of {length} bytes exceeds the server's limit of {max_bytes} bytes")


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not JSON: {e}") from None
    except RecursionError:
        raise BadRequest("request body is not JSON this server can read: nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def client_gone(sock: socket.socket) -> bool:
    """True once the client has closed its side (its request is in: anything readable now is the end)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or already closed
        return True
