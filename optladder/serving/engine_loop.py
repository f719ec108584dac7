"""The engine on its own thread, fed by many: what an HTTP server (optladder/serving/server.py) puts in front of
`LLMEngine`, which is single-threaded by design.

One thread owns the engine and is the only one to call `add_request`, `abort_request` and `step`, exactly
as the in-process replay driver does; other threads (or an event loop) `submit` through a thread-safe
inbox and get their request's TokenEvents through an outbox of their own (anything with `put`: a
`queue.Queue` for a handler thread, or a bridge into an event loop). `abort` drops a request whose client left, so its
KV blocks go back to the pool at once. When the loop ends (shutdown, or the engine raised), every request
not yet finished gets an `EngineDead` instead of hanging, and later submits are refused.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from optladder.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
_STOP = object()


class EngineDead(RuntimeError):
    """The engine thread is gone: the request cannot finish."""


class Outbox(Protocol):
    """Where a request's TokenEvents go, then a ValueError (refused) or EngineDead instead, if any."""

    def put(self, item) -> None: ...


@dataclass
class _Submit:
    request_id: str
    prompt_token_ids: list[int]
    params: object
    arrival: float
    out: Outbox


@dataclass
class _Abort:
    request_id: str


class EngineLoop:
    def __init__(self, engine: "LLMEngine"):
        self.engine = engine
        self.dead: str | None = None  # why the loop ended, once it has
        self.aborted = 0  # requests dropped because their client left
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, Outbox] = {}
        self._lock = threading.Lock()  # orders submit against the loop's end: nothing lands unanswered
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.thread.start()

    def submit(self, request_id: str, prompt_token_ids: list[int], params, out: Outbox) -> None:
        """Queue a request; its TokenEvents go to `out` in order, up to the finished one. Raises EngineDead
        if the loop has ended; a refusal by the engine (too long) arrives in `out` as a ValueError."""
        with self._lock:
            if self.dead is not None:
                raise EngineDead(self.dead)
            self._inbox.put(_Submit(request_id, prompt_token_ids, params, time.monotonic(), out))

    def abort(self, request_id: str) -> None:
        """The client left: stop generating for it and free its KV blocks (a no-op once it finished)."""
        self._inbox.put(_Abort(request_id))

    def busy(self) -> bool:
        """Requests submitted, running or waiting to be aborted (read from any thread: a snapshot)."""
        return bool(self._streams) or not self._inbox.empty()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(_STOP)  # wakes a loop blocked on an empty inbox
        self.thread.join(timeout)

    # --- the engine thread ---
    def _run(self) -> None:
        why = "server shut down"
        try:
            while not self._stop.is_set():
                timeout = None  # idle: sleep until something is submitted
                if self.engine.has_unfinished():
                    events = self.engine.step()
                    self._dispatch(events)
                    if events:
                        timeout = 0.0
                    else:  # a static batch is held back until it fills or times out
                        deadline = self.engine.next_deadline()
                        timeout = max(0.0, deadline - time.monotonic()) if deadline else 0.001
                self._admit(timeout)
        except BaseException as e:  # noqa: BLE001 - whatever killed the engine, every client hears of it
            why = f"engine failed: {e!r}"
            log.exception("engine loop failed")
        finally:
            self._fail_all(why)

    def _admit(self, timeout: float | None) -> None:
        try:
            item = self._inbox.get(timeout=timeout) if timeout != 0.0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not _STOP:
            if isinstance(item, _Abort):
                if self._streams.pop(item.request_id, None) is not None:
                    self.engine.abort_request(item.request_id)
                    self.aborted += 1
            else:
                try:
                    self.engine.add_request(item.request_id, item.prompt_token_ids, item.params,
                                            arrival_time=item.arrival)
                    self._streams[item.request_id] = item.out
                except ValueError as e:  # refused (too long): the client gets it, the loop goes on
                    item.out.put(e)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _dispatch(self, events) -> None:
        for ev in events:
            out = self._streams.get(ev.request_id)
            if out is not None:
                out.put(ev)
            if ev.finished:
                self._streams.pop(ev.request_id, None)

    def _fail_all(self, why: str) -> None:
        with self._lock:
            self.dead = why
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Submit):
                item.out.put(EngineDead(why))
        for out in self._streams.values():
            out.put(EngineDead(why))
        self._streams.clear()
