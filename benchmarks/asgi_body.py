"""The ASGI server's body reading (benchmarks/asgi_server.py): bounded in size, then optladder/serving/edge.py's parse."""
from __future__ import annotations

from starlette.requests import Request

from optladder.serving.edge import parse_json
from optladder.serving.openai_protocol import BadRequest

# An oversized body is read to its end (and thrown away) up to this multiple of the limit before the 413:
# a server that answers and closes while the client is still sending resets the connection, and the
# client then sees "connection reset" instead of the status that says what was wrong.
_DRAIN_FACTOR = 8


class BodyTooLarge(ValueError):
    """Answered with HTTP 413."""


async def read_json(request: Request, max_bytes: int) -> dict:
    declared = request.headers.get("content-length")
    if declared is not None and not declared.strip().isdigit():
        raise BadRequest(f"Content-Length {declared!r} is not a number of bytes")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size <= max_bytes:
            parts.append(part)
        elif size > _DRAIN_FACTOR * max_bytes:
            break
    if size > max_bytes:
        raise BodyTooLarge(f"request body of {size if size <= _DRAIN_FACTOR * max_bytes else 'over ' + str(size)} "
                           f"bytes exceeds the server's limit of {max_bytes} bytes")
    return parse_json(b"".join(parts))
