"""A soak, free of Hydra and MLflow (so it also runs on a GPU image that has neither: benchmarks/gpu_soak.py):
the reference engine behind its HTTP server, fed a workload in a loop for `soak.duration_min` (each pass at
the workload's own timing, one pass after the other), bad requests mixed in at `soak.bad_request_rate`,
memory and KV sampled every `soak.sample_s`, a report per window and the verdict gates of optladder/abtest/soak.py.
requests.jsonl and bad_requests.jsonl are written as requests end; soak.json, soak.md and soak.png at the end,
the windows built from requests.jsonl read back (the soak keeps no per-request dict; the replay clients still
return a record per request, without its token times: ~0.4 KB each).
"""
from __future__ import annotations

import json
import logging
import os
import random
import secrets
import threading
import time
from dataclasses import asdict
from pathlib import Path

import psutil

from optladder.abtest.soak import Sample, SoakConfig, as_dicts, bad_table, decide, windows
from optladder.experiments.soak_report import plot_soak, soak_markdown
from optladder.serving.server import serve
from optladder.traffic.bad_requests import KINDS, Target, send_bad
from optladder.traffic.http_driver import replay_http
from optladder.traffic.replay_config import Pacing, ReplayConfig
from optladder.traffic.request import Request, RequestRecord
from optladder.traffic.thread_client import replay_threads

log = logging.getLogger(__name__)
MIB = float(1 << 20)
CLIENTS = {"locust": replay_http, "threads": replay_threads}
GOOD_FIELDS = ("sent_at", "first_token_at", "finished_at", "scheduled_at", "output_tokens", "ok", "error")


def looped(requests: list[Request], duration_s: float) -> list[Request]:
    """The workload again and again, each pass one mean gap after the last, up to duration_s: real timing."""
    last = max(r.scheduled_at for r in requests)
    period = last + (last / (len(requests) - 1) if len(requests) > 1 and last > 0 else 1.0)
    out, k = [], 0
    while k * period < duration_s:
        out += [Request(f"{r.id}.{k}", r.prompt_token_ids, r.output_len, r.scheduled_at + k * period, None,
                        r.ignore_eos, r.prefix_group) for r in requests if r.scheduled_at + k * period < duration_s]
        k += 1
    return out


def bad_schedule(n_good: int, duration_s: float, rate: float, seed: int) -> list[tuple[float, str]]:
    """Poisson times for bad requests, `rate` of all requests; kinds in turn, so every kind is seen."""
    if rate <= 0:
        return []
    per_s = rate / (1 - rate) * n_good / duration_s
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(per_s)
        if t >= duration_s:
            return out
        out.append((t, KINDS[len(out) % len(KINDS)]))


def soak_replay(backend, workload: list[Request], cfg: SoakConfig, run_dir: Path, model: str, host: str = "127.0.0.1",
         timeout_s: float = 3600.0, seed: int = 0, progress: bool = False) -> dict:
    """Run the soak with a ReferenceBackend whose warm-up is done; the report (soak.json's content)."""
    engine = backend.engine
    duration = cfg.duration_min * 60
    requests = looped(workload, duration)
    bad_plan = bad_schedule(len(requests), duration, cfg.bad_request_rate, seed)
    log.info("soak %s: %d requests over %.0f min (%d passes of the workload), %d bad requests", cfg.name,
             len(requests), cfg.duration_min, len({r.id.rsplit('.', 1)[1] for r in requests}), len(bad_plan))
    key = secrets.token_hex(16)
    bad: list[dict] = []
    samples: list[Sample] = []
    t0 = time.monotonic()
    offset = [float("inf")]  # the locust worker's clock starts later than ours: the least arrival lag
    with serve(backend.stepper, host, 0, model, api_key=key, max_body_bytes=cfg.max_body_bytes) as server, \
            open(run_dir / "requests.jsonl", "a") as f, open(run_dir / "bad_requests.jsonl", "a") as fb:
        start = f.tell()  # this soak's records: read back from here at the end, not held meanwhile

        def on_record(rec: RequestRecord) -> None:
            f.write(rec.to_json() + "\n")
            f.flush()
            if rec.finished_at is not None:
                offset[0] = min(offset[0], time.monotonic() - t0 - rec.finished_at)
            rec.token_times, rec.output_text = [], ""  # on disk now: a 30-min soak must not grow by its records

        stop = threading.Event()
        target = Target(server.url, model, key, engine.cfg.max_model_len, cfg.max_body_bytes)
        threads = [threading.Thread(target=_sample, args=(engine, cfg.sample_s, t0, samples, stop), daemon=True),
                   threading.Thread(target=_send_bad, args=(bad_plan, target, t0, bad, fb, stop), daemon=True)]
        for t in threads:
            t.start()
        rcfg = ReplayConfig(progress=progress, request_timeout_s=timeout_s, max_users=cfg.max_users)
        CLIENTS[cfg.client](requests, server.url, model, rcfg, Pacing("open"), on_record, key)
        threads[1].join()  # the bad requests end with their schedule
        _wait_idle(engine, server.loop)
        stop.set()
        threads[0].join()
        kv_free, aborted = engine.block_manager.all_free(), server.loop.aborted
    end = time.monotonic() - t0
    shift = offset[0] if offset[0] != float("inf") else 0.0
    good = _read_good(run_dir / "requests.jsonl", start, shift)
    wins = windows(good, bad, samples, cfg.window_s, end)
    gates = decide(cfg, wins, samples, len(requests), len(bad_plan), good, bad, kv_free, aborted, end)
    verdict = "pass" if all(g.status == "pass" for g in gates) else "fail"
    report = {"soak": cfg.name, "verdict": verdict, "duration_s": end, "requests": len(requests),
              "bad_requests": len(bad_plan), "aborted": aborted, "client": cfg.client, "gates": as_dicts(gates),
              "bad_by_kind": bad_table(bad), "windows": as_dicts(wins), "config": asdict(cfg)}
    (run_dir / "soak.json").write_text(json.dumps(report, indent=2))
    (run_dir / "soak.md").write_text(soak_markdown(report))
    plot_soak(run_dir / "soak.png", wins, samples)
    return report


def window_metrics(w: dict) -> dict[str, float]:
    """One window of soak.json under soak/ names, for MLflow (step = the window's index)."""
    numbers = {**w["latency_ms"], "bad_requests": sum(w["bad"].values())}
    numbers.update({k: w[k] for k in ("rss_mib", "anon_mib", "device_mib", "errors", "requests", "kv_used_blocks",
                                      "kv_free_blocks") if w[k] is not None})
    return {f"soak/{k}": float(v) for k, v in numbers.items()}


def _read_good(path: Path, start: int, shift: float) -> list[dict]:
    """The fields the windows and gates need of each request record on disk from byte `start` on (this soak's),
    in the order they finished, their times shifted by `shift` into our clock (the samples' and bad requests')."""
    out = []
    with open(path, "rb") as f:
        f.seek(start)
        for line in f:
            rec = json.loads(line)
            r = {k: rec[k] for k in GOOD_FIELDS}
            for k in ("sent_at", "first_token_at", "finished_at", "scheduled_at"):
                r[k] = None if r[k] is None else r[k] + shift
            out.append(r)
    return out


def _sample(engine, every_s: float, t0: float, out: list[Sample], stop: threading.Event) -> None:
    proc, cuda = psutil.Process(os.getpid()), engine.device.type == "cuda"
    bm = engine.block_manager
    while True:
        device = None
        if cuda:
            import torch

            device = torch.cuda.memory_allocated(engine.device) / MIB
        free = bm.num_free_blocks
        mem = proc.memory_info()  # rss - shared: the anonymous memory a leak grows (file pages come and go)
        out.append(Sample(time.monotonic() - t0, mem.rss / MIB, (mem.rss - mem.shared) / MIB, device,
                          bm.num_blocks - free, free))
        if stop.wait(every_s):
            return


def _send_bad(plan, target: Target, t0: float, out: list[dict], f, stop: threading.Event) -> None:
    for at, kind in plan:
        if stop.wait(max(0.0, t0 + at - time.monotonic())):
            return
        rec = send_bad(kind, target, time.monotonic() - t0)
        f.write(rec.to_json() + "\n")
        f.flush()
        out.append(json.loads(rec.to_json()))


def _wait_idle(engine, loop, settle_s: float = 1.0, timeout_s: float = 120.0) -> None:
    """Until the engine has nothing to do and its inbox is empty for `settle_s` (late aborts included)."""
    deadline, quiet_since = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        busy = engine.has_unfinished() or loop.busy()
        quiet_since = None if busy else (quiet_since or time.monotonic())
        if quiet_since is not None and time.monotonic() - quiet_since >= settle_s:
            return
        time.sleep(0.05)
    log.warning("the engine was still busy %.0f s after the last request", timeout_s)
