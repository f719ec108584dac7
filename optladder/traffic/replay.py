"""The in-process replay driver: requests arrive on their own thread at their scheduled times (open loop)
or as earlier ones finish (closed loop), while the engine steps on this thread.

Sending on a separate thread matters: a request's clock starts when it is sent, not when the engine
next looks, so time spent queueing behind a busy engine shows in TTFT, and `lateness` (sent minus
scheduled) measures only the driver.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Callable, Protocol

from tqdm import tqdm

from optladder.traffic.metrics import lateness_warning
from optladder.traffic.replay_config import Pacing, ReplayConfig
from optladder.traffic.request import STOPPED, Request, RequestRecord, StopReplay

log = logging.getLogger(__name__)


class StepEngine(Protocol):
    """What the driver needs of an in-process engine (engine.llm_engine.LLMEngine has it)."""

    def add_request(self, request_id: str, prompt_token_ids: list[int], params, arrival_time: float): ...
    def step(self) -> list: ...
    def has_unfinished(self) -> bool: ...
    def next_deadline(self) -> float | None: ...


class InProcessDriver:
    def __init__(self, engine: StepEngine, make_params: Callable[[Request], object],
                 on_record: Callable[[RequestRecord], None] | None = None):
        self.engine = engine
        self.make_params = make_params
        self.on_record = on_record or (lambda r: None)

    def replay(self, requests: list[Request], cfg: ReplayConfig, pacing: Pacing) -> list[RequestRecord]:
        self.t0 = time.monotonic()
        self.records = {r.id: RequestRecord(r.id, r.scheduled_at if pacing.mode == "open" else 0.0,
                                            r.input_len, r.output_len) for r in requests}
        self.inbox: queue.Queue = queue.Queue()
        self.bar = tqdm(total=len(requests), desc="replay", unit="req", disable=not cfg.progress)
        self._pending = deque(requests)
        self._closed, self._stop = pacing.mode == "closed", False
        self._stopped: str | None = None  # why on_record stopped the replay
        if pacing.mode == "open":
            threading.Thread(target=self._send_open_loop, args=(list(requests),), daemon=True).start()
        else:
            for _ in range(min(pacing.concurrency, len(requests))):
                self._send_now(self._pending.popleft())
        try:
            self._loop(len(requests))
            if self._stopped is not None:
                self._abort_unfinished()
        except BaseException as e:  # keep what was done; the rest becomes counted errors
            self._fail_open(f"engine failed mid-replay: {e!r}")
            raise
        finally:
            self.bar.close()
            self._stop = True
        out = [self.records[r.id] for r in requests]
        warning = lateness_warning(out, cfg.lateness_warn_ms, "driver")
        if warning:
            log.warning(warning)
        return out

    # --- sending ---
    def _send_open_loop(self, requests: list[Request]) -> None:
        for r in sorted(requests, key=lambda r: r.scheduled_at):
            delay = self.t0 + r.scheduled_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if self._stop:
                return
            self._send_now(r)

    def _send_now(self, r: Request) -> None:
        now = time.monotonic()
        rec = self.records[r.id]
        if self._closed:  # closed loop: a request is due the moment a slot frees, which is now
            rec.scheduled_at = now - self.t0
        rec.sent_at = now - self.t0
        self.inbox.put((r, now))

    # --- the engine loop ---
    def _loop(self, total: int) -> None:
        done = 0
        while done < total and self._stopped is None:
            timeout = None
            if self.engine.has_unfinished():
                events = self.engine.step()
                if events:
                    done += self._handle(events)
                    timeout = 0.0
                else:  # a static batch is being held back until it fills or times out
                    deadline = self.engine.next_deadline()
                    timeout = max(0.0, deadline - time.monotonic()) if deadline else 0.001
            done += self._drain(timeout)

    def _drain(self, timeout: float | None) -> int:
        """Admit what has been sent; block up to `timeout` for the first. Returns requests rejected."""
        rejected = 0
        try:
            item = self.inbox.get(timeout=timeout) if timeout != 0.0 else self.inbox.get_nowait()
        except queue.Empty:
            return 0
        while True:
            r, sent = item
            try:
                self.engine.add_request(r.id, r.prompt_token_ids, self.make_params(r), arrival_time=sent)
            except ValueError as e:  # rejected (e.g. longer than max_model_len): counted, never truncated
                self._finish(self.records[r.id], ok=False, error=f"rejected: {e}")
                rejected += 1
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return rejected

    def _handle(self, events) -> int:
        finished = 0
        for ev in events:
            rec = self.records[ev.request_id]
            t = ev.time - self.t0
            if rec.first_token_at is None:
                rec.first_token_at = t
            rec.token_times.append(t)
            rec.output_tokens = ev.num_output_tokens
            rec.output_text += ev.text
            rec.preemptions = ev.num_preemptions
            if ev.finished:
                rec.finished_at = t
                self._finish(rec, ok=True)
                finished += 1
        return finished

    def _finish(self, rec: RequestRecord, ok: bool, error: str | None = None) -> None:
        rec.ok, rec.error = ok, error
        self._emit(rec)
        self.bar.update(1)
        if self._closed and self._pending and not self._stop:
            self._send_now(self._pending.popleft())

    def _emit(self, rec: RequestRecord) -> None:
        """on_record, once per record; a StopReplay from it stops the replay (the first one, where the engine
        can abort) and never escapes, so a failure being reported stays the error that is raised."""
        try:
            self.on_record(rec)
        except StopReplay as e:
            if self._stopped is None and hasattr(self.engine, "abort_request"):
                self._stopped, self._stop = str(e), True

    def _abort_unfinished(self) -> None:
        """After a StopReplay: the engine forgets every unfinished request (its KV blocks freed), what was
        sent but not yet admitted is dropped, and their records fail with the reason."""
        while True:
            try:
                self.inbox.get_nowait()
            except queue.Empty:
                break
        for rec in self._unfinished():
            self.engine.abort_request(rec.id)
            rec.ok, rec.error = False, STOPPED + self._stopped
            self._emit(rec)
            self.bar.update(1)
        log.info("replay stopped early: %s", self._stopped)

    def _unfinished(self) -> list[RequestRecord]:
        """Records still open: not finished, not failed (rejected ones carry their error)."""
        return [r for r in self.records.values() if not r.ok and r.error is None and r.finished_at is None]

    def _fail_open(self, why: str) -> None:
        for rec in self._unfinished():
            rec.error = why
            self._emit(rec)
