"""One experiment end to end: build the engine, warm up, replay, measure, check quality, log, snapshot.

Everything a run leaves behind is written to its run directory as it happens (requests.jsonl line by
line), then copied to MLflow, so a run that dies halfway keeps what it did and is marked FAILED.
"""
from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from backends import make_backend
from experiments.build import build
from experiments.plots import plot_run
from experiments.snapshot import build_snapshot, write_snapshot
from experiments.tracking import Tracker, flatten
from quality.prompts import load_prompt_set, prompts_digest
from quality.scoring import score_vs_references, to_metrics
from traffic.capacity import capacity_metrics, find_capacity, requests_at
from traffic.metrics import compute_metrics
from traffic.replay_config import Pacing
from traffic.request import Request, RequestRecord, requests_digest
from traffic.workload import build_workload

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


def run_experiment(cfg: DictConfig, run_dir: Path, overrides: list[str] | None = None,
                   choices: dict | None = None, run_name: str | None = None,
                   parent_run_id: str | None = None, tags: dict[str, str] | None = None,
                   with_quality: bool = True) -> ExperimentResult:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    conf = build(cfg)  # the dataclasses: unknown keys refused, each validates its own fields here
    resolved = OmegaConf.to_container(cfg, resolve=True)
    snapshot = build_snapshot(resolved, overrides or [], choices or {})
    write_snapshot(run_dir, snapshot)
    from engine.opts import enabled_opts

    opts = enabled_opts(conf.engine)
    base_tags = {"engine": conf.engine.name, "model": conf.model.name, "opts": ",".join(opts) or "baseline",
                 "git_commit": str(snapshot["environment"].get("git_commit")),
                 "device": snapshot["environment"].get("gpu") or "cpu"}
    with Tracker(conf.tracking, run_name or _default_name(conf, opts), {**base_tags, **(tags or {})},
                 parent_run_id, run_dir) as tracker:
        tracker.log_params(flatten(resolved))
        return _run(conf, run_dir, snapshot, tracker, opts, with_quality)


def _default_name(conf, opts: list[str]) -> str:
    return f"{conf.engine.name}:{'+'.join(opts) or 'baseline'}:{conf.model.name}"


def _run(conf, run_dir: Path, snapshot: dict, tracker: Tracker, opts: list[str],
         with_quality: bool) -> ExperimentResult:
    backend = make_backend(conf.model, conf.engine, conf.replay.driver, conf.faults)
    try:  # a server-backed engine (vLLM) must stop on every exit path, not only at process exit
        return _measure(conf, backend, run_dir, snapshot, tracker, opts, with_quality)
    finally:
        backend.close()


def _measure(conf, backend, run_dir: Path, snapshot: dict, tracker: Tracker, opts: list[str],
             with_quality: bool) -> ExperimentResult:
    data_root = conf.data.root
    metrics: dict[str, float] = {"perf/load_s": backend.load_s, "perf/start_s": backend.start_s}
    workload = build_workload(conf.workload, backend.tokenizer, conf.engine.max_model_len, data_root)
    for w in workload.warnings:
        log.warning("workload: %s", w)
    snapshot["requests_digest"] = requests_digest(workload.requests)
    write_snapshot(run_dir, snapshot)
    metrics.update(workload.stats)

    backend.warmup(warmup_requests(workload.requests[:conf.replay.warmup_requests], len(backend.tokenizer)))
    with open(run_dir / "requests.jsonl", "a") as f:
        def on_record(rec: RequestRecord) -> None:
            f.write(rec.to_json() + "\n")
            f.flush()  # a crash keeps every request that finished

        pacing = Pacing(workload.mode, workload.concurrency)
        records = backend.replay(workload.requests, conf.replay, pacing, on_record)
    metrics.update(compute_metrics(records, conf.slo))
    metrics.update(backend.metrics())
    if conf.replay.capacity:  # after the engine's own metrics, so the probes do not blur them
        metrics.update(_capacity(conf, backend, workload.requests, run_dir))
    tracker.log_metrics(metrics)

    outputs, per_prompt, qmetrics, pdigest, signature = _quality(conf, backend, run_dir, data_root, with_quality)
    metrics.update(qmetrics)
    snapshot["prompts_digest"] = pdigest
    write_snapshot(run_dir, snapshot)
    tracker.log_metrics(qmetrics)
    _log_kv_timeline(tracker, backend)
    plot_run(run_dir, records, getattr(backend, "kv_timeline", lambda: [])())

    summary = {
        "run_id": tracker.run_id, "run_dir": str(run_dir), "engine": conf.engine.name, "model": conf.model.name,
        "opts": opts, "opts_effective": backend.opts_effective(), "metrics": metrics,
        "quality": {"set": conf.quality.name, "num_prompts": len(outputs), "bleu_signature": signature,
                    **{k: v for k, v in qmetrics.items()}},
        "workload": {"name": conf.workload.name, "num_requests": len(records), "mode": workload.mode,
                     "source": workload.source},
        "verdict": None,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return ExperimentResult(tracker.run_id, run_dir, metrics, records, outputs, per_prompt,
                            snapshot["requests_digest"], pdigest, summary["opts_effective"], opts, snapshot)


def warmup_requests(like: list[Request], vocab_size: int, seed: int = 12345) -> list[Request]:
    """The lengths of the first requests with unrelated token ids: warming up on the replayed prompts
    themselves would put them in the prefix cache and flatter it."""
    rng = random.Random(seed)
    return [Request(f"warmup-{i}", [rng.randrange(vocab_size // 4, vocab_size) for _ in range(r.input_len)],
                    min(4, r.output_len)) for i, r in enumerate(like)]


def _quality(conf, backend, run_dir: Path, data_root, with_quality: bool = True):
    from engine.tokenizer import chat_token_ids

    items = load_prompt_set(conf.quality, data_root)
    if not with_quality:  # a repeat of an A/B arm: greedy outputs were scored on its first run
        return [], {}, {}, prompts_digest(items), None
    t0 = time.perf_counter()
    prompts = [chat_token_ids(backend.tokenizer, it.prompt) for it in items]
    outputs = backend.generate(prompts, conf.quality.max_new_tokens, progress=conf.replay.progress)
    scores = score_vs_references(outputs, [it.references for it in items])
    with open(run_dir / "quality_outputs.jsonl", "w") as f:
        for it, out, s in zip(items, outputs, scores.per_prompt):
            f.write(json.dumps({"id": it.id, "prompt": it.prompt, "output": out, "references": it.references,
                                "task": it.task, "scores": s}) + "\n")
    per_prompt = {f"quality/{k}_vs_ref": [s[k] for s in scores.per_prompt]
                  for k in ("bleu", "rouge1", "rouge2", "rougeL")}
    qmetrics = to_metrics(scores)
    qmetrics["quality/num_prompts"] = float(len(items))
    qmetrics["quality/rejected"] = float(sum(len(p) >= conf.engine.max_model_len for p in prompts))
    qmetrics["quality/generate_s"] = time.perf_counter() - t0
    return outputs, per_prompt, qmetrics, prompts_digest(items), scores.bleu_signature


def _log_kv_timeline(tracker: Tracker, backend) -> None:
    points = getattr(backend, "kv_timeline", lambda: [])()
    if not points:
        return
    stride = max(1, len(points) // 200)  # a curve, not one metric row per engine step
    gib = float(1 << 30)
    points = points[::stride]
    tracker.log_series({"kv/reserved_gb": [r / gib for _, r, _ in points],
                        "kv/used_gb": [u / gib for _, _, u in points],
                        "kv/util": [u / r if r else 0.0 for _, r, u in points]})


def _capacity(conf, backend, requests, run_dir: Path) -> dict[str, float]:
    """Bisect for the largest concurrency (or rate) whose P99 E2E meets slo.e2e_s; probes in capacity.json."""
    rc = conf.replay
    closed = rc.capacity_mode == "concurrency"

    quiet = replace(rc, progress=False)

    def run_at(load: float) -> list[RequestRecord]:
        reqs = requests_at(requests, rc.capacity_requests, load, rc.capacity_mode, conf.seed)
        pacing = Pacing("closed", int(load)) if closed else Pacing("open")
        return backend.replay(reqs, quiet, pacing, lambda rec: None)

    result = find_capacity(run_at, rc.capacity_lo, rc.capacity_hi, conf.slo, rc.capacity_mode, rc.capacity_iters)
    (run_dir / "capacity.json").write_text(json.dumps(result.to_dict(), indent=2))
    log.info("capacity: %s = %s at P99 E2E <= %.1f s (%d probes)%s", rc.capacity_mode, result.value,
             result.slo_e2e_s, len(result.probes), "; hi passed, raise replay.capacity_hi" if result.at_hi else "")
    return capacity_metrics(result)
