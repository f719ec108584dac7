"""The HTTP replay driver: locust, headless and programmatic, against any OpenAI-compatible endpoint
(the reference engine's optladder/serving/server.py, vLLM, a remote deployment), with the same records as the
in-process driver.

    records = replay_http(requests, "http://127.0.0.1:8000", "tiny", ReplayConfig(), Pacing("open"), on_record)

Locust runs in a child process (`python -m optladder.traffic.locust_worker`): it monkey-patches the standard
library for gevent, which must not touch a process running torch, and a client in its own process
does not steal the engine's interpreter. The requests go to the child as a JSON file; records come
back as JSON lines the moment each request ends, so `on_record` can append them to requests.jsonl as
they finish. Times in the records are seconds on the monotonic clock from the start of the replay.

Nothing here can hang: each request has a total deadline (`timeout_s`); a refused connection marks the
server gone and fails the rest at once; a child silent for STALL_S (it sends heartbeats) is killed; and
every request the child never reported becomes a counted error (ok=False, error=...), with what was
done kept. The settings are the config's `replay` group (optladder/traffic/replay_config.py): `request_timeout_s`,
`endpoint`, `max_users`, `lateness_warn_ms`, `progress`.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from optladder.traffic.metrics import lateness_warning
from optladder.traffic.replay_config import Pacing, ReplayConfig
from optladder.traffic.request import Request, RequestRecord

from optladder.paths import CHECKOUT, PROJECT_ROOT

log = logging.getLogger(__name__)
STALL_S = 60.0  # the child heartbeats every 2 s; this much silence means it is stuck


def replay_http(requests: list[Request], base_url: str, model: str, cfg: ReplayConfig, pacing: Pacing,
                on_record: Callable[[RequestRecord], None] | None = None,
                api_key: str | None = None) -> list[RequestRecord]:
    """Replay `requests` against `base_url` (without /v1); one record per request, in request order.
    api_key: sent as a bearer token (engine=openai against a guarded endpoint)."""
    on_record = on_record or (lambda r: None)
    records: dict[str, RequestRecord] = {}
    with tempfile.TemporaryDirectory(prefix="optladder-locust-") as tmp, \
            tqdm(total=len(requests), desc="replay (http)", unit="req", disable=not cfg.progress) as bar:
        spec = Path(tmp, "replay.json")
        spec.write_text(json.dumps({
            "mode": pacing.mode, "concurrency": pacing.concurrency, "endpoint": cfg.endpoint,
            "request_timeout_s": cfg.request_timeout_s, "max_users": cfg.max_users, "api_key": api_key,
            "base_url": base_url.rstrip("/"), "model": model, "requests": [_as_dict(r) for r in requests]}))
        stderr_path = Path(tmp, "stderr.txt")
        with open(stderr_path, "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "optladder.traffic.locust_worker", str(spec)],
                                    stdout=subprocess.PIPE, stderr=err, cwd=PROJECT_ROOT, env=_child_env())
        try:
            why = _collect(proc, records, on_record, bar)
        finally:
            if proc.poll() is None:
                proc.kill()
            rc = proc.wait()
        why = why or _exit_reason(rc, stderr_path)
    for r in requests:  # never reported: counted errors, not silently missing
        if r.id not in records:
            rec = RequestRecord(r.id, r.scheduled_at if pacing.mode == "open" else 0.0, r.input_len, r.output_len,
                                error=f"not replayed: {why or 'the locust worker reported no record'}")
            records[r.id] = rec
            on_record(rec)
    out = [records[r.id] for r in requests]
    _warn(out, cfg)
    return out


def _collect(proc: subprocess.Popen, records: dict[str, RequestRecord],
             on_record: Callable[[RequestRecord], None], bar) -> str | None:
    """Read the child's lines until it exits; None, or why it was stopped early."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:  # a thread, so a silent child can be noticed instead of blocking on read
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="locust-worker-reader", daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=STALL_S)
        except queue.Empty:
            proc.kill()
            return f"the locust worker was silent for {STALL_S:.0f} s and was stopped"
        if line is None:
            return None
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            log.warning("locust worker wrote a line that is not JSON: %r", line[:200])
            continue
        if "record" in msg:
            rec = RequestRecord.from_dict(msg["record"])
            records[rec.id] = rec
            on_record(rec)
            bar.update(1)


def _as_dict(r: Request) -> dict:
    return {"id": r.id, "prompt_token_ids": r.prompt_token_ids, "output_len": r.output_len,
            "scheduled_at": r.scheduled_at, "prompt": r.prompt, "ignore_eos": r.ignore_eos}


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    if CHECKOUT:  # run from a checkout without an install: the worker imports the package from there too
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), env.get("PYTHONPATH")) if p)
    return env


def _exit_reason(rc: int, stderr_path: Path) -> str | None:
    if rc == 0:
        return None
    tail = stderr_path.read_text(errors="replace").strip().splitlines()[-20:]
    log.error("locust worker exited with status %d:\n%s", rc, "\n".join(tail))
    return f"the locust worker exited with status {rc}: {tail[-1] if tail else 'no output'}"


def _warn(records: list[RequestRecord], cfg: ReplayConfig) -> None:
    late = lateness_warning(records, cfg.lateness_warn_ms, "client")
    if late:
        log.warning(late)
    short = sum(r.ok and r.output_tokens != r.requested_output_tokens for r in records)
    if short:
        log.warning("%d requests returned another number of tokens than asked for: the server may not honour "
                    "ignore_eos/min_tokens, and per-token metrics compare unlike work", short)
    failed = sum(not r.ok for r in records)
    if failed:
        first = next(r.error for r in records if not r.ok)
        log.warning("%d of %d requests failed over HTTP; the first: %s", failed, len(records), first)
