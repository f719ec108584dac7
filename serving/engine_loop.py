"""The engine on its own thread, fed by many: what an HTTP server (serving/server.py) puts in front of
`LLMEngine`, which is single-threaded by design.

One thread owns the engine and is the only one to call `add_request` and `step`, exactly as the
in-process replay driver does; other threads `submit` through a thread-safe inbox and read their
request's TokenEvents from a queue of its own. When the loop ends (shutdown, or the engine raised),
every request not yet finished gets an `EngineDead` instead of hanging, and later submits are refused.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
_STOP = object()


class EngineDead(RuntimeError):
    """The engine thread is gone: the request cannot finish."""


class EngineLoop:
    def __init__(self, engine: "LLMEngine"):
        self.engine = engine
        self.dead: str | None = None  # why the loop ended, once it has
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()  # orders submit against the loop's end: nothing lands unanswered
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.thread.start()

    def submit(self, request_id: str, prompt_token_ids: list[int], params) -> Iterator:
        """Queue a request; iterate the result for its TokenEvents, in order, up to the finished one.
        Iterating raises ValueError if the engine refused the request, EngineDead if the loop ended."""
        out: queue.Queue = queue.Queue()
        with self._lock:
            if self.dead is not None:
                raise EngineDead(self.dead)
            self._inbox.put((request_id, prompt_token_ids, params, time.monotonic(), out))
        return self._events(out)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(_STOP)  # wakes a loop blocked on an empty inbox
        self.thread.join(timeout)

    # --- the reading side ---
    def _events(self, out: queue.Queue) -> Iterator:
        while True:
            try:
                item = out.get(timeout=5.0)
            except queue.Empty:  # belt and braces: a dead loop always answers, but never wait on one
                if self.dead is not None and not self.thread.is_alive() and out.empty():
                    raise EngineDead(self.dead) from None
                continue
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return

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
            request_id, prompt, params, arrival, out = item
            try:
                self.engine.add_request(request_id, prompt, params, arrival_time=arrival)
                self._streams[request_id] = out
            except ValueError as e:  # refused (too long): the client gets it, the loop goes on
                out.put(e)
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
            if item is not _STOP:
                item[-1].put(EngineDead(why))
        for out in self._streams.values():
            out.put(EngineDead(why))
        self._streams.clear()
