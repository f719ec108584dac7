"""An OpenAI-compatible HTTP server for the reference engine, so the engine can be measured the way a
client sees it (HTTP, streaming, a load generator in another process) and compared with vLLM on equal terms.

    handle = serve(engine, "127.0.0.1", 0, model_name="tiny")   # 0: a free port
    ... POST {handle.url}/v1/completions ...
    handle.shutdown()

Stdlib: a ThreadingHTTPServer (a thread per connection) in front of one engine thread
(`optladder.serving.engine_loop.EngineLoop`), the only thread that touches the engine. It was measured against an
ASGI server (Starlette under uvicorn, as vLLM runs, benchmarks/asgi_server.py) at 300 open streams
(benchmarks/http_overhead.py) and kept: it added less to TTFT p99 at the same CPU per token (docs/reliability.md, "Which server").
Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions.
Accepted as vLLM accepts them: `prompt` as text or as a list of token ids (so a replayed prompt keeps its
exact length), `max_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `ignore_eos`, `min_tokens`, `stream`
with `stream_options.include_usage`. Streams are SSE (`data: {...}` then `data: [DONE]`) in chunked
transfer encoding, one chunk per generated token, flushed at once (TCP_NODELAY), so a client can time
every token. Fields that would change the output and that the engine cannot honour (n > 1, stop, logprobs,
echo, min_tokens below max_tokens without ignore_eos) are refused with HTTP 400, never silently ignored.

The edge (optladder/serving/edge.py): it binds 127.0.0.1 unless told otherwise; with an API key set, /v1 routes want
`Authorization: Bearer <key>` (constant-time compare) or get 401; a body over `max_body_bytes` gets 413;
malformed JSON or fields, a prompt that does not fit max_model_len, max_tokens <= 0 or too large get 400
with the reason; an unknown model 404. A client that disconnects, mid-stream or while it waits, has its
sequence aborted in the engine (its KV blocks freed at once).
"""
from __future__ import annotations

import json
import logging
import queue
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from optladder.serving.edge import MAX_BODY_BYTES, Refused, check_key, client_gone, parse_json, read_body
from optladder.serving.engine_loop import EngineDead, EngineLoop
from optladder.serving.openai_protocol import (BadRequest, Completion, TokenEvents, chunk, final_response, parse_chat,
                                     parse_completion)

if TYPE_CHECKING:
    from optladder.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
POLL_S = 0.25  # while a request waits on the engine, how often its client is checked for a hang-up
PARSERS = {"/v1/completions": parse_completion, "/v1/chat/completions": parse_chat}


@dataclass
class ServerHandle:
    url: str  # http://host:port, without /v1
    model: str
    httpd: ThreadingHTTPServer
    loop: EngineLoop
    thread: threading.Thread

    @property
    def tokenizer(self):
        return self.httpd.tokenizer

    def shutdown(self) -> None:
        """Stop accepting, stop the engine thread (requests in flight end with an error), free the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.loop.stop()
        self.thread.join(timeout=10)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # a replay opens hundreds of connections at once; the default backlog of 5 drops SYNs, and the
    # client's SYN retry (1 s) would show up as latency the engine never caused
    request_queue_size = 1024
    loop: EngineLoop
    model: str
    tokenizer: object
    max_model_len: int
    vocab_size: int
    tokenize_lock: threading.Lock
    api_key: bytes | None
    max_body_bytes: int

    def handle_error(self, request, client_address) -> None:
        # a client that hangs up (a load generator closing its connections) is routine, not a traceback
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            log.debug("client %s hung up", client_address)
        else:
            log.exception("error serving %s", client_address)


def serve(engine: "LLMEngine", host: str = "127.0.0.1", port: int = 0, model_name: str = "reference",
          api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> ServerHandle:
    """Serve `engine` (an LLMEngine nobody else steps meanwhile) until `.shutdown()`. port 0: a free one."""
    httpd = _Server((host, port), _Handler)
    httpd.loop = EngineLoop(engine)
    httpd.model = model_name
    httpd.tokenizer = engine.tokenizer
    httpd.max_model_len = engine.cfg.max_model_len
    httpd.vocab_size = engine.model.shape.vocab_size
    httpd.tokenize_lock = threading.Lock()
    httpd.api_key = api_key.encode() if api_key else None
    httpd.max_body_bytes = max_body_bytes
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                              name="http-server", daemon=True)
    thread.start()
    bound_host, bound_port = httpd.server_address[:2]
    log.info("serving %s at http://%s:%d", model_name, bound_host, bound_port)
    return ServerHandle(f"http://{bound_host}:{bound_port}", model_name, httpd, httpd.loop, thread)


class ClientGone(Exception):
    """The client hung up while its request waited on the engine."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked streams whose end the client can tell apart
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt: str, *args) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    # --- routing ---
    def do_GET(self) -> None:
        s = self.server
        try:
            if self.path == "/health":  # probes need no key
                alive = s.loop.dead is None
                self._json(200 if alive else 503, {"status": "ok" if alive else s.loop.dead})
            elif self.path == "/v1/models":
                check_key(self.headers.get("Authorization"), s.api_key)
                self._json(200, {"object": "list", "data": [{
                    "id": s.model, "object": "model", "created": int(time.time()), "owned_by": "optladder",
                    "max_model_len": s.max_model_len}]})
            else:
                self._error(404, f"no route GET {self.path}; valid: /health, /v1/models", "not_found_error")
        except Refused as e:
            self._error(e.status, e.message, e.kind)

    def do_POST(self) -> None:
        s = self.server
        try:
            check_key(self.headers.get("Authorization"), s.api_key)
            body = parse_json(read_body(self.rfile, self.headers.get("Content-Length"), s.max_body_bytes))
            if self.path not in PARSERS:
                self._error(404, f"no route POST {self.path}; valid: {', '.join(PARSERS)}", "not_found_error")
                return
            if body.get("model") not in (None, s.model):
                self._error(404, f"model {body.get('model')!r} does not exist; served: {s.model!r}",
                            "not_found_error")
                return
            with s.tokenize_lock:  # one tokenizer shared by every handler thread
                req = PARSERS[self.path](body, s.tokenizer, s.max_model_len, s.vocab_size)
        except Refused as e:
            self.close_connection = e.status in (401, 411, 413)  # a body may be left unread
            self._error(e.status, e.message, e.kind)
            return
        except BadRequest as e:
            self._error(400, str(e))
            return
        self._complete(req)

    # --- a generation ---
    def _complete(self, req: Completion) -> None:
        rid = f"{'chatcmpl' if req.chat else 'cmpl'}-{uuid.uuid4().hex}"
        out: queue.Queue = queue.Queue()
        try:
            self.server.loop.submit(rid, req.prompt_token_ids, req.params, out)
            first = self._next(rid, out)  # the status line waits for the first token: errors still get a status
            if req.stream:
                self._stream(rid, req, first, out)
            else:
                self._whole(rid, req, first, out)
        except EngineDead as e:
            self._error(503, str(e), "server_error")
        except ValueError as e:  # the engine refused it (e.g. too long for max_model_len)
            self._error(400, str(e))
        except (ClientGone, BrokenPipeError, ConnectionResetError):  # the client left: its sequence is dropped
            self.server.loop.abort(rid)
            self.close_connection = True

    def _next(self, rid: str, out: queue.Queue):
        """The request's next TokenEvent; ClientGone if its client has hung up (checked every POLL_S)."""
        while True:
            now = time.monotonic()
            if now - getattr(self, "_checked_at", 0.0) >= POLL_S:
                self._checked_at = now
                if client_gone(self.connection):
                    raise ClientGone(rid)
            try:
                item = out.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def _stream(self, rid: str, req: Completion, first, out: queue.Queue) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        model, created = self.server.model, int(time.time())
        tokens = TokenEvents(rid, model, created, req.chat)  # the JSON around a token's text is built once
        try:
            if req.chat:
                self._sse(chunk(rid, model, created, req.chat, "", None, role=True))
            ev = first
            while True:
                self._write_chunk(tokens.event(ev.text, _finish(ev)))
                if ev.finished:
                    break
                ev = self._next(rid, out)
            if req.include_usage:
                self._sse(chunk(rid, model, created, req.chat, None, None, usage=_usage(req, ev)))
            self._write_chunk(b"data: [DONE]\n\n")
        except EngineDead as e:  # the stream ends with an error event and no [DONE]
            self._sse({"error": {"message": str(e), "type": "server_error", "code": 503}})
            self.close_connection = True
        self._write_chunk(b"")

    def _whole(self, rid: str, req: Completion, first, out: queue.Queue) -> None:
        text, ev = [first.text], first
        while not ev.finished:
            ev = self._next(rid, out)
            text.append(ev.text)
        self._json(200, final_response(rid, self.server.model, int(time.time()), req.chat, "".join(text),
                                       _finish(ev), _usage(req, ev)))

    # --- wire ---
    def _json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

    def _sse(self, obj: dict) -> None:
        self._write_chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _write_chunk(self, data: bytes) -> None:
        # one write per chunk: size line, payload and CRLF leave together, not as three small segments
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))


def _finish(ev) -> str | None:
    if not ev.finished:
        return None
    return "stop" if ev.finish_reason == "stop" else "length"  # max_tokens and max_model_len alike


def _usage(req: Completion, last) -> dict:
    p, n = len(req.prompt_token_ids), last.num_output_tokens  # the engine's count, not the chunks'
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
