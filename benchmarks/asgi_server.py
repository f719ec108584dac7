"""The ASGI server measured against the stdlib one (optladder/serving/server.py) by benchmarks/http_overhead.py, and
kept only for that comparison: the same endpoints, wire format, edge and engine thread, on the stack vLLM's
own server uses. At 300 open streams on the project's 2-core machine it added more to TTFT p99 than the
stdlib server at the same CPU per token, so the stdlib one stayed (README).

    handle = serve(engine, "127.0.0.1", 0, model_name="tiny")   # 0: a free port
    ... POST {handle.url}/v1/completions ...
    handle.shutdown()

The stack vLLM's own server uses: an ASGI app (Starlette) under uvicorn, one event loop for every
connection, in front of one engine thread (`optladder.serving.engine_loop.EngineLoop`), the only thread that touches
the engine. Endpoints: GET /health, GET /v1/models, POST /v1/completions,
POST /v1/chat/completions; the wire format is optladder/serving/openai_protocol.py's.

The edge: it binds 127.0.0.1 unless told otherwise; with an API key set, every /v1 route wants
`Authorization: Bearer <key>` (compared in constant time) and answers 401 without it; a body over
`max_body_bytes` gets 413 before it is read in full; malformed JSON or fields, a prompt that does not fit
max_model_len, max_tokens <= 0 or too large get 400 with the reason; an unknown model 404. A client that
disconnects, mid-stream or while it waits, has its sequence aborted in the engine (KV blocks freed at once).
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from asgi_body import BodyTooLarge, read_json
from optladder.serving.edge import Refused, check_key
from optladder.serving.engine_loop import EngineDead, EngineLoop
from optladder.serving.openai_protocol import (BadRequest, Completion, TokenEvents, chunk, final_response, parse_chat,
                                     parse_completion)

if TYPE_CHECKING:
    from optladder.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 << 20  # a max_model_len prompt as token ids is well under 1 MiB even at 128k tokens
BACKLOG = 2048  # a replay opens hundreds of connections at once; a full backlog drops SYNs (1 s retries)


@dataclass
class ServerHandle:
    url: str  # http://host:port, without /v1
    model: str
    loop: EngineLoop
    tokenizer: object
    server: uvicorn.Server
    thread: threading.Thread

    def shutdown(self) -> None:
        """Stop the engine thread (requests in flight end with an error), then the server; free the port."""
        self.loop.stop()
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def serve(engine: "LLMEngine", host: str = "127.0.0.1", port: int = 0, model_name: str = "reference",
          api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> ServerHandle:
    """Serve `engine` (an LLMEngine nobody else steps meanwhile) until `.shutdown()`. port 0: a free one."""
    loop = EngineLoop(engine)
    api = OpenAIApi(loop, model_name, engine.tokenizer, engine.cfg.max_model_len,
                    engine.model.shape.vocab_size, api_key, max_body_bytes)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    config = uvicorn.Config(api.app(), log_level="warning", access_log=False, lifespan="off",
                            backlog=BACKLOG, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="http-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            loop.stop()
            raise RuntimeError(f"the HTTP server did not start on {host}:{port}")
        time.sleep(0.01)
    bound_host, bound_port = sock.getsockname()[:2]
    log.info("serving %s at http://%s:%d", model_name, bound_host, bound_port)
    return ServerHandle(f"http://{bound_host}:{bound_port}", model_name, loop, engine.tokenizer, server, thread)


class OpenAIApi:
    """The ASGI app. The two generation routes are served by hand (they are the hot path: an SSE event per
    token per stream, taking CPU from the engine's interpreter), the rest by Starlette."""

    def __init__(self, loop: EngineLoop, model: str, tokenizer, max_model_len: int, vocab_size: int,
                 api_key: str | None, max_body_bytes: int):
        self.loop, self.model, self.tokenizer = loop, model, tokenizer
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self._outbox: AsyncOutbox | None = None  # made on the event loop, at the first request
        self._parsers = {"/v1/completions": parse_completion, "/v1/chat/completions": parse_chat}
        self._rest = Starlette(routes=[Route("/health", self.health, methods=["GET"]),
                                       Route("/v1/models", self.models, methods=["GET"])],
                               exception_handlers={404: _not_found, 405: _not_allowed})

    def app(self) -> "OpenAIApi":
        return self

    async def __call__(self, scope, receive, send) -> None:
        parse = self._parsers.get(scope.get("path", "")) if scope["type"] == "http" else None
        if parse is None:
            await self._rest(scope, receive, send)
            return
        request = Request(scope, receive)
        if request.method != "POST":
            response = error(405, f"{request.method} is not allowed on {request.url.path}; use POST")
        else:
            response = await self._generate(request, parse)
        await response(scope, receive, send)

    # --- routes ---
    async def health(self, request: Request) -> Response:
        alive = self.loop.dead is None
        return JSONResponse({"status": "ok" if alive else self.loop.dead}, status_code=200 if alive else 503)

    async def models(self, request: Request) -> Response:
        return self._denied(request) or JSONResponse({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": int(time.time()), "owned_by": "optladder",
            "max_model_len": self.max_model_len}]})

    # --- a generation ---
    async def _generate(self, request: Request, parse):
        denied = self._denied(request)
        if denied:
            return denied
        try:
            body = await read_json(request, self.max_body_bytes)
            if body.get("model") not in (None, self.model):
                return error(404, f"model {body.get('model')!r} does not exist; served: {self.model!r}",
                             "not_found_error")
            req = parse(body, self.tokenizer, self.max_model_len, self.vocab_size)
        except BodyTooLarge as e:
            return error(413, str(e))
        except BadRequest as e:
            return error(400, str(e))
        rid = f"{'chatcmpl' if req.chat else 'cmpl'}-{uuid.uuid4().hex}"
        if self._outbox is None:
            self._outbox = AsyncOutbox(asyncio.get_running_loop())
        chan = self._outbox.channel()
        try:
            self.loop.submit(rid, req.prompt_token_ids, req.params, chan)
            # the status line waits for the first token, so a refusal still gets a status of its own
            first = await self._unless_gone(request, rid, chan.get())
        except EngineDead as e:
            return error(503, str(e), "server_error")
        except ValueError as e:  # the engine refused it (e.g. too long for max_model_len)
            return error(400, str(e))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; uvicorn drops it
        if req.stream:
            return SSEStream(self, rid, req, first, chan)
        try:
            return await self._unless_gone(request, rid, self._whole(rid, req, first, chan))
        except ClientGone:
            return Response(status_code=499)

    async def _whole(self, rid: str, req: Completion, first, chan: AsyncChannel) -> Response:
        text, ev = [first.text], first
        try:
            while not ev.finished:
                ev = await chan.get()
                text.append(ev.text)
        except EngineDead as e:
            return error(503, str(e), "server_error")
        return JSONResponse(final_response(rid, self.model, int(time.time()), req.chat, "".join(text),
                                           finish_reason(ev), usage(req, ev)))

    async def _unless_gone(self, request: Request, rid: str, work):
        """Await `work` unless the client disconnects first: then abort its sequence and raise ClientGone."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not task.done():
            task.cancel()
            self.loop.abort(rid)
            raise ClientGone(rid)
        return task.result()

    # --- the edge ---
    def _denied(self, request: Request) -> Response | None:
        try:
            check_key(request.headers.get("authorization"), self.api_key)
        except Refused as e:
            return error(e.status, e.message, e.kind)
        return None


class SSEStream:
    """The ASGI response of a stream: one event per token, sent as it comes (asyncio sets TCP_NODELAY).
    A client that hangs up ends it at once, and its sequence is aborted in the engine."""

    HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]

    def __init__(self, api: OpenAIApi, rid: str, req: Completion, first, chan: AsyncChannel):
        self.api, self.rid, self.req, self.first, self.chan = api, rid, req, first, chan
        self.finished = first.finished  # the engine has sent the last event (or is dead): nothing to abort

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.HEADERS})
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            pump.cancel()
            gone.cancel()
            if not self.finished:
                self.api.loop.abort(self.rid)

    async def _pump(self, send) -> None:
        async for data in self._events():
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _events(self):
        req, ev = self.req, self.first
        model, created = self.api.model, int(time.time())
        events = TokenEvents(self.rid, model, created, req.chat)
        try:
            if req.chat:
                yield sse(chunk(self.rid, model, created, req.chat, "", None, role=True))
            while True:
                yield events.event(ev.text, finish_reason(ev))
                if ev.finished:
                    break
                ev = await self.chan.get()
                self.finished = ev.finished
            if req.include_usage:
                yield sse(chunk(self.rid, model, created, req.chat, None, None, usage=usage(req, ev)))
            yield b"data: [DONE]\n\n"
        except EngineDead as e:  # the stream ends with an error event and no [DONE]
            self.finished = True
            yield sse({"error": {"message": str(e), "type": "server_error", "code": 503}})


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _disconnected(receive) -> None:
    """Returns once the client has hung up (the body has been read, so the next message is the end)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _not_found(request: Request, exc) -> Response:
    return error(404, f"no route {request.method} {request.url.path}; valid: GET /health, GET /v1/models, "
                 "POST /v1/completions, POST /v1/chat/completions", "not_found_error")


async def _not_allowed(request: Request, exc) -> Response:
    return error(405, f"{request.method} is not allowed on {request.url.path}", "invalid_request_error")


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status)


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def finish_reason(ev) -> str | None:
    if not ev.finished:
        return None
    return "stop" if ev.finish_reason == "stop" else "length"  # max_tokens and max_model_len alike


def usage(req: Completion, last) -> dict:
    p, n = len(req.prompt_token_ids), last.num_output_tokens  # the engine's count, not the chunks'
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}


class AsyncOutbox:
    """Token events from the engine thread into asyncio queues, with one event-loop wake-up per engine
    step however many streams it fed (a wake-up per token would cost a self-pipe write each, hundreds per
    step at a few hundred open streams)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._pending: list[tuple[asyncio.Queue, object]] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def channel(self) -> "AsyncChannel":
        return AsyncChannel(self, asyncio.Queue())

    def put(self, q: asyncio.Queue, item) -> None:  # the engine thread
        with self._lock:
            self._pending.append((q, item))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the event loop is closed: the server is gone, nobody is reading
            pass

    def _flush(self) -> None:  # the event loop
        with self._lock:
            items, self._pending, self._scheduled = self._pending, [], False
        for q, item in items:
            q.put_nowait(item)


@dataclass
class AsyncChannel:
    """One request's outbox (for the engine thread) and its async reading side (for the server)."""

    outbox: AsyncOutbox
    queue: asyncio.Queue

    def put(self, item) -> None:
        self.outbox.put(self.queue, item)

    async def get(self):
        """The next TokenEvent; raises the ValueError or EngineDead the engine thread sent instead."""
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item
