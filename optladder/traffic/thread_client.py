"""An open-loop HTTP replay client on the standard library alone: each request sent at its scheduled time on
a thread of its own, streamed over http.client, timed token by token (optladder/traffic/sse.py), with the records of
the locust driver. For machines without locust (the GPU image has neither it nor gevent); where locust is
there, optladder/traffic/http_driver.py is the better client: it runs in a process of its own, so it takes no
interpreter time from the engine it measures.

    records = replay_threads(requests, "http://127.0.0.1:8000", "tiny", ReplayConfig(), Pacing("open"), on_record)
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable
from urllib.parse import urlparse

from optladder.traffic.replay_config import Pacing, ReplayConfig
from optladder.traffic.request import Request, RequestRecord
from optladder.traffic.sse import TokenStream, completion_payload


def replay_threads(requests: list[Request], base_url: str, model: str, cfg: ReplayConfig, pacing: Pacing,
                   on_record: Callable[[RequestRecord], None] | None = None,
                   api_key: str | None = None) -> list[RequestRecord]:
    """Replay `requests` (open loop) against `base_url` (without /v1); one record per request, in order.
    The arguments are replay_http's (optladder/traffic/http_driver.py)."""
    if pacing.mode != "open" or cfg.endpoint != "completions":
        raise ValueError("the thread client replays open-loop /v1/completions only; use the locust driver")
    url, lock, t0 = urlparse(base_url), threading.Lock(), time.monotonic()
    records: dict[str, RequestRecord] = {}

    def clock() -> float:
        return time.monotonic() - t0

    def one(r: Request) -> None:
        rec = RequestRecord(r.id, r.scheduled_at, r.input_len, r.output_len)
        try:
            _send(url, model, r, rec, cfg, api_key, clock)
        except Exception as e:  # noqa: BLE001 - any failure is this request's error, never a lost record
            rec.ok, rec.error = False, f"client error: {e!r}"
        with lock:
            records[r.id] = rec
            if on_record is not None:
                on_record(rec)

    with ThreadPoolExecutor(max_workers=cfg.max_users, thread_name_prefix="replay") as pool:
        for r in sorted(requests, key=lambda r: r.scheduled_at):
            delay = r.scheduled_at - clock()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, r)
    return [records[r.id] for r in requests]


def _send(url, model: str, r: Request, rec: RequestRecord, cfg: ReplayConfig, api_key: str | None, clock) -> None:
    body = json.dumps(completion_payload({"id": r.id, "prompt_token_ids": r.prompt_token_ids,
                                          "output_len": r.output_len, "prompt": r.prompt,
                                          "ignore_eos": r.ignore_eos}, model, chat=False)).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    stream = TokenStream(False, clock)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=cfg.request_timeout_s)
    try:
        rec.sent_at = clock()
        conn.request("POST", "/v1/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            rec.error = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            return
        for line in resp:
            stream.feed(line.rstrip(b"\r\n"))
            if stream.error:
                break
    except OSError as e:
        stream.error = f"stream broken after {len(stream.token_times)} tokens: {e!r}"
    finally:
        conn.close()
    stream.fill(rec)
