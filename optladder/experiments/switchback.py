"""A switchback A/B: both arms' engines loaded at once, the trace played in short blocks, the arms taking turns.

Run-to-run noise is what kept one pair of whole runs from deciding (an A/A's E2E p99 moved by an SD of 10% on a
CPU, 29% on the H200): a fresh process, the allocator's state, a neighbour, the clock drifting over minutes. Here
each block of consecutive requests (their arrivals as in the trace, re-based to the block's start) is replayed on
one arm and at once on the other (AB AB AB ...: run_switchback says why not AB BA), so whatever drifts over minutes
hits both arms of a block alike, and each arm's engine stays loaded between its blocks. The latency gates then
compare the pooled requests of all blocks, with an interval from resampling whole blocks (the block is the unit
of replication: optladder/abtest/run_pairs.py block_interval), so the noise that is left is measured, not assumed.

An arm's run is one MLflow run as in any A/B (its MLflow run opens when its blocks are done: two runs open at once
would mix their metrics), its records laid end to end on one time line (throughput = requests over the time its
blocks took), blocks.json naming each block's requests. Quality (greedy answers) is scored once per arm after the
blocks, as in one run of design=runs.
"""
from __future__ import annotations

import json
import logging
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from optladder.traffic.request import Request

log = logging.getLogger(__name__)

BLOCKS_FILE = "blocks.json"
LOOKS_FILE = "looks.json"
ORDER_FILE = "switchback.json"  # in the A/B's directory: every replay in the order it ran


def split_blocks(requests: list[Request], blocks: int) -> list[list[Request]]:
    """Consecutive blocks of near-equal size, in trace order, each block's schedule re-based to its first
    request's arrival (a block starts at once, as if the trace began there)."""
    if blocks < 1:
        raise ValueError(f"ab.blocks must be >= 1, got {blocks}")
    if len(requests) < 2 * blocks:
        raise ValueError(f"ab.blocks={blocks} needs at least {2 * blocks} requests (two a block), the workload has "
                         f"{len(requests)}: lower ab.blocks or raise workload.num_requests")
    order = sorted(range(len(requests)), key=lambda i: (requests[i].scheduled_at, i))
    out: list[list[Request]] = []
    for b in range(blocks):
        idx = order[b * len(order) // blocks:(b + 1) * len(order) // blocks]
        t0 = requests[idx[0]].scheduled_at
        out.append([replace(requests[i], scheduled_at=requests[i].scheduled_at - t0) for i in idx])
    return out


def look_points(blocks: int, looks: int) -> list[int]:
    """After how many blocks each interim look of a sequential switchback comes (the last, at the end, is not
    interim): `looks` near-equal shares of the blocks."""
    return sorted({round(j * blocks / looks) for j in range(1, looks)} - {0, blocks})


def run_switchback(arms, blocks: int, out_dir: Path, parent_run_id: str | None, progress: bool = True,
                   looks: int = 1, stop=None) -> list[dict]:
    """Load every arm's engine (each an ArmSession), replay the blocks with the arms taking turns in a fixed order
    (AB AB AB ...), then finish each arm's run in turn (metrics, quality, its MLflow run) and close it. Each arm
    gets one ExperimentResult in arm.runs, its records of each block in .blocks.

    Why not AB BA AB: then the arm that opens a block is the one that closed the block before, running twice in a
    row with its weights and KV still in the caches. On the 2-core CPU that made the opener of a block faster, and
    since the arm loaded second opens one block more (it warms up last), A/As came out biased: median change -9%
    over 10 A/As (benchmarks/results/error_rates/README.md). AB AB gives every replay the same history (the other
    arm ran just before it); the arm order within a block is then fixed, which a slow drift over one replay's
    length could bias by a fraction of that drift.

    looks > 1 (ab.looks): after each of look_points(blocks, looks), stop({arm name: its blocks' records so far})
    is asked; 'pass' or 'fail' ends the replay there (the remaining blocks are not played). Returns the looks made,
    each {"after_blocks", "decided"}, also written to looks.json."""
    from optladder.experiments.experiment import ArmSession, free_device_memory

    requests = arms[0].prepared.workload.requests
    parts = split_blocks(requests, blocks)
    with ExitStack() as stack:
        sessions = []
        for arm in arms:
            tags = {"optladder.arm": arm.name, "optladder.repeat": "0", "optladder.design": "switchback",
                    "optladder.blocks": str(blocks)}
            session = ArmSession(arm.cfg, out_dir / f"{arm.name}-r0", overrides=arm.overrides,
                                 run_name=f"{arm.name} (switchback, {blocks} blocks)", parent_run_id=parent_run_id,
                                 tags=tags, with_quality=arm.score_quality, prepared=arm.prepared,
                                 defer_tracking=True)
            sessions.append(session)
        # engine=vllm: every arm's server launched before any is awaited, so that their starts (a minute or more of
        # imports and compilation each on a GPU) overlap; then the in-process engines load, after the servers
        # are up (a server's start-up check sees the GPU memory free then), and every arm warms up in turn
        served = [s for s in sessions if s.cfg.engine.name == "vllm"]
        for session in served:
            stack.push(session.start(wait=False).__exit__)
        for session in served:
            session.wait_engine()
        for session in sessions:
            if session not in served:
                stack.push(session.start().__exit__)
        for session in sessions:
            session.ready()
        quiet = [replace(x.conf.replay, progress=False) for x in sessions]
        per_arm: list[list[list]] = [[] for _ in arms]
        played = []  # the replays in the order they ran: block, arm, wall-clock start and end
        clock = [0.0] * len(arms)  # each arm's blocks laid end to end
        took = [0.0] * len(arms)
        t_start = time.monotonic()
        points = set(look_points(len(parts), looks)) if stop is not None else set()
        made: list[dict] = []
        with tqdm(total=len(parts) * len(arms), desc="switchback", unit="block", disable=not progress) as bar:
            for b, part in enumerate(parts):
                if b in points:  # an interim look, before block b: the first b blocks of every arm
                    decided = stop({a.name: per_arm[i] for i, a in enumerate(arms)})
                    made.append({"after_blocks": b, "decided": decided})
                    log.info("switchback: look after %d of %d blocks: %s", b, len(parts), decided or "undecided")
                    if decided in ("pass", "fail"):
                        break
                for i in range(len(arms)):  # AB AB AB: each replay follows the other arm's (see the docstring)
                    t0 = time.monotonic()
                    recs = sessions[i].replay(part, quiet[i], time_offset=clock[i])
                    dt = time.monotonic() - t0
                    took[i] += dt
                    per_arm[i].append(recs)
                    played.append({"block": b, "arm": arms[i].name, "start_s": round(t0 - t_start, 4),
                                   "end_s": round(t0 + dt - t_start, 4)})
                    # the next block starts where this one's last request finished (not after the replay call's
                    # own overhead: a server started per block, a scrape), so throughput is the blocks' own
                    ends = [r.finished_at for r in recs if r.finished_at is not None]
                    clock[i] = max(ends) if ends else clock[i] + dt
                    bar.update(1)
        (out_dir / ORDER_FILE).write_text(json.dumps(played, indent=1))
        if stop is not None:
            (out_dir / LOOKS_FILE).write_text(json.dumps(made, indent=1))
        log.info("switchback: %d of %d blocks of ~%d requests on %d arms in %.0f s (%s)", len(per_arm[0]), len(parts),
                 len(requests) // len(parts), len(arms), time.monotonic() - t_start,
                 ", ".join(f"{a.name} {t:.0f} s" for a, t in zip(arms, took)))
        for arm, session, recs in zip(arms, sessions, per_arm):
            (session.run_dir / BLOCKS_FILE).write_text(json.dumps([[r.id for r in block] for block in recs]))
            res = session.finish([r for block in recs for r in block], probes=False)
            res.blocks = recs
            arm.runs.append(res)
            session.close()  # its MLflow run ends, its engine stops, before the next arm's run opens
            free_device_memory()
    return made


def read_blocks(run_dir: Path, records) -> list[list]:
    """The blocks of a switchback run read back (blocks.json and its records); [] for a run of design=runs."""
    path = Path(run_dir) / BLOCKS_FILE
    if not path.is_file():
        return []
    by_id = {r.id: r for r in records}
    return [[by_id[i] for i in ids if i in by_id] for ids in json.loads(path.read_text())]


def check_switchback_arms(confs) -> None:
    """What differs between arms held in one process and would not be compared fairly there."""
    threads = {c.engine.cpu_threads for c in confs}
    if len(threads) > 1:
        raise ValueError(f"the arms set engine.cpu_threads to {sorted(threads, key=str)}: torch's thread count is "
                         "one for the whole process, so in a switchback the arm loaded last sets it for both; "
                         "compare thread counts with ab.design=runs")


def check_switchback(conf) -> None:
    """What a switchback cannot do, refused before any engine loads (ValueError naming the setting)."""
    rc = conf.replay
    if rc.capacity:
        raise ValueError("replay.capacity=true probes one engine alone: it needs ab.design=runs, not switchback")
    if rc.load_levels:
        raise ValueError("replay.load_levels replays the whole trace per level: it needs ab.design=runs, "
                         "not switchback")
    if conf.profile is not None:
        raise ValueError("+profile traces one replay: it needs ab.design=runs, not switchback")
    if conf.engine.name in ("vllm", "reference") and conf.engine.kv_cache_gb is None:
        raise ValueError(f"engine={conf.engine.name} with engine.kv_cache_gb=null: the KV budget is then a fraction "
                         "of the memory free when the engine loads, so of the two engines a switchback holds at "
                         "once the second would get less; give both one budget that fits twice, e.g. "
                         "engine.kv_cache_gb=4")
