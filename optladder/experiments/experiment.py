"""One experiment end to end: build the engine, warm up, replay, measure, check quality, log, snapshot.

Everything a run leaves behind is written to its run directory as it happens (requests.jsonl line by
line), then copied to MLflow, so a run that dies halfway keeps what it did and is marked FAILED.
"""
from __future__ import annotations

import json
import logging
import random
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from optladder.backends import make_backend
from optladder.experiments.build import build
from optladder.experiments.errors import as_user_error
from optladder.experiments.levels import levels_markdown, run_levels
from optladder.experiments.plots import plot_run
from optladder.experiments.preflight import Prepared, prepare
from optladder.experiments.report import results_markdown
from optladder.experiments.run_views import (dataset_inputs, effective_tags_params, kv_curves, run_name as default_run_name,
                                             run_tags)
from optladder.experiments.snapshot import build_snapshot, write_snapshot
from optladder.experiments.tracking import LOST, Tracker, TrackingUnreachable, flatten
from optladder.quality.prompts import prompts_digest
from optladder.quality.scoring import score_vs_references, to_metrics
from optladder.traffic.capacity import capacity_metrics, find_capacity, requests_at, stop_when_missed
from optladder.traffic.metrics import compute_metrics
from optladder.traffic.replay_config import Pacing
from optladder.traffic.request import Request, RequestRecord, requests_digest

log = logging.getLogger(__name__)


@dataclass
class ExperimentResult:
    run_id: str | None
    run_dir: Path
    metrics: dict[str, float]
    records: list[RequestRecord]
    outputs: list[str]
    quality_per_prompt: dict[str, list[float]]
    requests_digest: str
    prompts_digest: str
    opts_effective: dict
    opts: list[str]
    snapshot: dict = field(default_factory=dict)
    load_levels: list[dict] = field(default_factory=list)  # per level: index, knob, value, metrics
    # per prompt, the greedy answer's top-k log-probs (optladder/quality/near_tie.py), for the lossless check;
    # empty when none were recorded, and why in traces_unavailable
    traces: list = field(default_factory=list)
    traces_unavailable: str | None = None
    # a switchback A/B's run (optladder/experiments/switchback.py): its records of each block, in block order
    blocks: list = field(default_factory=list)


def run_experiment(cfg: DictConfig, run_dir: Path, overrides: list[str] | None = None,
                   choices: dict | None = None, run_name: str | None = None,
                   parent_run_id: str | None = None, tags: dict[str, str] | None = None,
                   with_quality: bool = True, prepared: Prepared | None = None) -> ExperimentResult:
    """prepared: the run's data, already loaded and checked (an A/B checks both arms before either runs)."""
    with ArmSession(cfg, run_dir, overrides, choices, run_name, parent_run_id, tags, with_quality,
                    prepared) as session:
        workload, conf = session.prepared.workload, session.conf
        if conf.profile is not None:
            session.backend.profile_next_replay(conf.profile, session.run_dir)
        records = session.replay(workload.requests)
        return session.finish(records, probes=True)


class ArmSession:
    """One experiment held open: its run (MLflow and run directory), its engine loaded and warm. replay() may be
    called several times (a switchback A/B plays the trace in blocks, the arms taking turns, both engines loaded
    at once: optladder/experiments/switchback.py); finish() measures what was replayed, scores quality and
    writes the run's results. Closing stops the engine and ends the run (FAILED when an exception left it).
    defer_tracking: the MLflow run opens in finish(), not before the engine loads (MLflow's fluent API logs to
    the run opened last, so two arms held open at once must not both have theirs open)."""

    def __init__(self, cfg: DictConfig, run_dir: Path, overrides: list[str] | None = None,
                 choices: dict | None = None, run_name: str | None = None, parent_run_id: str | None = None,
                 tags: dict[str, str] | None = None, with_quality: bool = True,
                 prepared: Prepared | None = None, defer_tracking: bool = False):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.overrides, self.choices, self.run_name = overrides or [], choices or {}, run_name
        self.parent_run_id, self.extra_tags, self.with_quality = parent_run_id, tags or {}, with_quality
        self.prepared, self.defer_tracking = prepared, defer_tracking
        self._stack = ExitStack()  # the engine
        self._track_stack = ExitStack()  # its MLflow run: ended after the engine stopped (its log complete)
        self.tracker: Tracker | None = None
        self.t_replay: float | None = None

    def __enter__(self) -> "ArmSession":
        return self.start().ready()

    def start(self, wait: bool = True) -> "ArmSession":
        """The run directory and snapshot, the engine loaded (or, wait=False, a server-backed one launched
        without waiting for it: a switchback launches every arm's server before ready() waits on any)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with as_user_error():
            self.conf = build(self.cfg)  # the dataclasses: unknown keys refused, each validates its own fields here
        self.prepared = self.prepared or prepare(self.conf)  # every data file, before an engine starts
        conf = self.conf
        self.resolved = OmegaConf.to_container(self.cfg, resolve=True)
        self.snapshot = build_snapshot(self.resolved, self.overrides, self.choices)
        write_snapshot(self.run_dir, self.snapshot)
        from optladder.engine.opts import enabled_opts

        self.opts = enabled_opts(conf.engine)
        try:
            if not self.defer_tracking:
                self._open_tracker()
            with as_user_error():  # the engine refuses a setting it cannot run before its weights load
                self.backend = make_backend(conf.model, conf.engine, conf.replay.driver, conf.faults,
                                            log_dir=self.run_dir, wait=wait)  # a server's log stays with its run
            # a server-backed engine (vLLM) must stop on every exit path, not only at process exit
            self._stack.callback(self.backend.close)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def wait_engine(self) -> None:
        """A server launched by start(wait=False) awaited (nothing for an engine loaded in start); once."""
        try:
            with as_user_error():
                self.backend.wait_ready()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise

    def ready(self) -> "ArmSession":
        """The engine answering (a launched server awaited) and warmed up on requests like the workload's."""
        self.wait_engine()
        conf, prepared = self.conf, self.prepared
        try:
            self.metrics: dict[str, float] = {"perf/load_s": self.backend.load_s, "perf/start_s": self.backend.start_s}
            workload = prepared.workload
            self.snapshot["requests_digest"] = requests_digest(workload.requests)
            write_snapshot(self.run_dir, self.snapshot)
            self.metrics.update(workload.stats)
            self.backend.warmup(warmup_requests(workload.requests[:conf.replay.warmup_requests],
                                                len(self.backend.tokenizer)))
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _open_tracker(self) -> None:
        conf, prepared = self.conf, self.prepared
        tags = {**run_tags(conf, self.opts, self.snapshot["environment"], prepared.workload.stats), **self.extra_tags}
        name = self.run_name or default_run_name(conf, self.opts, tags)
        try:
            self.tracker = self._track_stack.enter_context(
                Tracker(conf.tracking, name, tags, self.parent_run_id, self.run_dir))
        except TrackingUnreachable as e:
            if not self.defer_tracking:
                raise  # before the engine loads: the run has cost nothing yet, the user fixes the store
            # after the replay (a switchback's deferred run): the store was lost meanwhile, as mid-run under
            # design=runs; the run goes on and keeps everything in its run directory (exit status 69)
            LOST.append(f"start_run: {e}")
            log.error("tracking lost before %s's run could open (%s); it goes on without MLflow", name, e)
            self.tracker = self._track_stack.enter_context(
                Tracker(replace(conf.tracking, enabled=False), name, tags, self.parent_run_id, self.run_dir))
        self.tracker.log_params(flatten(self.resolved))
        if self.tracker.enabled:  # the workload and the prompt set as MLflow dataset inputs, by file and digest
            for dataset in dataset_inputs(conf, prepared):
                self.tracker.log_dataset(**dataset)

    def __exit__(self, *exc) -> bool:
        try:
            self._stack.__exit__(*exc)  # the engine stops first
        except BaseException:
            self._track_stack.__exit__(*sys.exc_info())  # a failed stop fails the run
            raise
        return bool(self._track_stack.__exit__(*exc))

    def close(self) -> None:
        self.__exit__(None, None, None)

    def replay(self, requests: list[Request], replay_cfg=None, time_offset: float = 0.0) -> list[RequestRecord]:
        """Replay requests (scheduled from this call's start), each record appended to requests.jsonl as it
        finishes, so a crash keeps every request that finished. time_offset: added to every time of the records
        (written and returned), to lay blocks replayed one after another on one time line."""
        conf = self.conf
        with open(self.run_dir / "requests.jsonl", "a") as f:
            def on_record(rec: RequestRecord) -> None:
                f.write((shift_record(rec, time_offset) if time_offset else rec).to_json() + "\n")
                f.flush()

            pacing = Pacing(self.prepared.workload.mode, self.prepared.workload.concurrency)
            if self.t_replay is None:
                self.t_replay = time.monotonic()
            records = self.backend.replay(requests, replay_cfg or conf.replay, pacing, on_record)
        return [shift_record(r, time_offset) for r in records] if time_offset else records

    def finish(self, records: list[RequestRecord], probes: bool = True) -> ExperimentResult:
        """The run's metrics from the records replayed, then (probes) capacity and load levels, then quality, the
        plots, results.md and summary.json."""
        if self.tracker is None:
            self._open_tracker()
        return _measure(self.conf, self.backend, self.run_dir, self.snapshot, self.tracker, self.opts,
                        self.with_quality, self.prepared, records, self.metrics, self.t_replay or time.monotonic(),
                        probes)


def free_device_memory() -> None:
    """What a finished (or failed) engine left cached on the GPU goes back to it, for the next engine."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def shift_record(rec: RequestRecord, dt: float) -> RequestRecord:
    """The record with every time moved by dt seconds."""
    def add(t):
        return None if t is None else t + dt

    return replace(rec, scheduled_at=rec.scheduled_at + dt, sent_at=add(rec.sent_at),
                   first_token_at=add(rec.first_token_at), finished_at=add(rec.finished_at),
                   token_times=[t + dt for t in rec.token_times])


def _measure(conf, backend, run_dir: Path, snapshot: dict, tracker: Tracker, opts: list[str],
             with_quality: bool, prepared: Prepared, records: list[RequestRecord], metrics: dict[str, float],
             t_replay: float, probes: bool) -> ExperimentResult:
    workload = prepared.workload
    # the replay's KV points only: warm-up was reset away, quality and capacity probes come after
    kv_points = list(getattr(backend, "kv_timeline", lambda: [])())
    metrics.update(compute_metrics(records, conf.slo))
    metrics.update(backend.metrics())
    effective = backend.opts_effective()  # before levels, probes and quality add to its counters
    if probes and conf.replay.capacity:  # after the engine's own metrics, so the probes do not blur them
        metrics.update(_capacity(conf, backend, workload.requests, run_dir))
    tracker.log_metrics(metrics)
    levels = (run_levels(conf, backend, workload.requests, run_dir, tracker)
              if probes and conf.replay.load_levels else [])

    outputs, per_prompt, qmetrics, pdigest, signature, traced = _quality(conf, backend, run_dir, prepared, with_quality)
    metrics.update(qmetrics)
    snapshot["prompts_digest"] = pdigest
    write_snapshot(run_dir, snapshot)
    tracker.log_metrics(qmetrics)
    tracker.log_series(*kv_curves(kv_points, t_replay))
    eff_tags, eff_params = effective_tags_params(effective)
    tracker.set_tags(eff_tags)
    tracker.log_params(eff_params)
    plot_run(run_dir, records, kv_points)
    title = f"optladder: {', '.join(opts) or 'baseline'} on {conf.model.name}"
    (run_dir / "results.md").write_text(results_markdown(metrics, title) + levels_markdown(levels))

    summary = {
        "run_id": tracker.run_id, "run_name": tracker.run_name, "run_dir": str(run_dir),
        "engine": conf.engine.name, "model": conf.model.name, "opts": opts, "opts_effective": effective,
        "metrics": metrics, "load_levels": levels,
        "quality": {"set": conf.quality.name if conf.quality.name != "jsonl" else Path(conf.quality.path).name,
                    "path": conf.quality.path, "num_prompts": len(outputs), "bleu_signature": signature,
                    **{k: v for k, v in qmetrics.items()}},
        "workload": {"name": conf.workload.name, "num_requests": len(records), "mode": workload.mode,
                     "source": workload.source},
        "verdict": None,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return ExperimentResult(tracker.run_id, run_dir, metrics, records, outputs, per_prompt,
                            snapshot["requests_digest"], pdigest, effective, opts, snapshot, levels, *traced)


def warmup_requests(like: list[Request], vocab_size: int, seed: int = 12345) -> list[Request]:
    """The lengths of the first requests with unrelated token ids: warming up on the replayed prompts
    themselves would put them in the prefix cache and flatter it."""
    rng = random.Random(seed)
    return [Request(f"warmup-{i}", [rng.randrange(vocab_size // 4, vocab_size) for _ in range(r.input_len)],
                    min(4, r.output_len)) for i, r in enumerate(like)]


def _quality(conf, backend, run_dir: Path, prepared: Prepared, with_quality: bool = True):
    items, prompts = prepared.items, prepared.prompt_ids
    if not with_quality:  # a repeat of an A/B arm: greedy outputs were scored on its first run
        return [], {}, {}, prompts_digest(items), None, ([], None)
    t0 = time.perf_counter()
    traced = getattr(backend, "generate_traced", None)
    if traced is not None:
        outputs, traces, why = traced(prompts, prepared.max_new_tokens, TRACE_TOP_K, progress=conf.replay.progress)
        write_traces(run_dir, items, traces, why)
    else:
        outputs = backend.generate(prompts, prepared.max_new_tokens, progress=conf.replay.progress)
        traces, why = [], f"engine={backend.name} records no log-probs of its answers"
    traces = traces if why is None else []
    scores = score_vs_references(outputs, [it.references for it in items])
    with open(run_dir / "quality_outputs.jsonl", "w") as f:
        for it, out, s in zip(items, outputs, scores.per_prompt):
            chat = {"messages": it.messages} if it.messages else {}
            f.write(json.dumps({"id": it.id, "prompt": it.prompt, **chat, "output": out,
                                "references": it.references, "task": it.task, "scores": s}) + "\n")
    per_prompt = {f"quality/{k}_vs_ref": [s[k] for s in scores.per_prompt]
                  for k in ("bleu", "rouge1", "rouge2", "rougeL")}
    qmetrics = to_metrics(scores)
    qmetrics["quality/num_prompts"] = float(len(items))
    qmetrics["quality/skipped_rows"] = float(prepared.quality_skipped)
    qmetrics["quality/max_new_tokens"] = float(prepared.max_new_tokens)
    qmetrics["quality/rejected"] = float(sum(len(p) >= conf.engine.max_model_len for p in prompts))
    qmetrics["quality/generate_s"] = time.perf_counter() - t0
    return outputs, per_prompt, qmetrics, prompts_digest(items), scores.bleu_signature, (traces, why)


TRACE_TOP_K = 5  # log-probs recorded per answer token for the lossless check (gate.near_tie_top_k at most this)
TRACES_FILE = "quality_traces.jsonl"


def write_traces(run_dir: Path, items, traces: list, why: str | None) -> None:
    """quality_traces.jsonl: per prompt its answer's tokens and top-k log-probs (a first line says why, when the
    engine recorded none), so a ladder resumed elsewhere can still judge this run's answers."""
    with open(run_dir / TRACES_FILE, "w") as f:
        if why is not None:
            f.write(json.dumps({"unavailable": why}) + "\n")
            return
        for it, tr in zip(items, traces):
            f.write(json.dumps({"id": it.id, "trace": None if tr is None else tr.to_dict()}) + "\n")


def read_traces(run_dir: Path) -> tuple[list, str | None]:
    """What write_traces wrote: (traces, None), ([], why), or ([], None) for a run that wrote none."""
    from optladder.quality.near_tie import GreedyTrace

    path = Path(run_dir) / TRACES_FILE
    if not path.is_file():
        return [], None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if rows and "unavailable" in rows[0]:
        return [], rows[0]["unavailable"]
    return [None if r["trace"] is None else GreedyTrace.from_dict(r["trace"]) for r in rows], None


def _capacity(conf, backend, requests, run_dir: Path) -> dict[str, float]:
    """Bisect for the largest concurrency (or rate) whose P99 E2E meets slo.e2e_s; probes in capacity.json."""
    rc = conf.replay
    closed = rc.capacity_mode == "concurrency"

    quiet = replace(rc, progress=False)
    # only the reference engine in process can stop a probe (the driver aborts its requests); over HTTP and on
    # engine=hf (no abort) probes run whole
    stop_early = rc.capacity_stop_early and backend.name == "reference" and rc.driver == "inprocess"

    def run_at(load: float) -> list[RequestRecord]:
        reqs = requests_at(requests, rc.capacity_requests, load, rc.capacity_mode, conf.seed)
        pacing = Pacing("closed", int(load)) if closed else Pacing("open")
        on_record = stop_when_missed(len(reqs), conf.slo.e2e_s) if stop_early else (lambda rec: None)
        return backend.replay(reqs, quiet, pacing, on_record)

    result = find_capacity(run_at, rc.capacity_lo, rc.capacity_hi, conf.slo, rc.capacity_mode, rc.capacity_iters)
    (run_dir / "capacity.json").write_text(json.dumps(result.to_dict(), indent=2))
    metrics = capacity_metrics(result)
    log.info("capacity: %s = %s at P99 E2E <= %.1f s (%d probes, %.0f s; %d stopped early)%s", rc.capacity_mode,
             result.value, result.slo_e2e_s, len(result.probes), metrics["capacity/search_s"],
             metrics["capacity/probes_stopped_early"], "; hi passed, raise replay.capacity_hi" if result.at_hi else "")
    return metrics
