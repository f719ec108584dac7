"""`python run.py +soak=<name>`: the soak of optladder/experiments/soak_core.py from the Hydra config, in MLflow (a metric
per window, soak.png and the reports as artifacts, the verdict as a tag); the exit status is 0 pass, 1 fail.

    python run.py +soak=cpu model=tiny '+opt=[paged_kv,dynamic_batching,batched_decode]' engine.cpu_threads=1
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from optladder.backends import make_backend
from optladder.experiments.experiment import warmup_requests
from optladder.experiments.snapshot import build_snapshot, write_snapshot
from optladder.experiments.soak_core import soak_replay, window_metrics
from optladder.experiments.tracking import Tracker
from optladder.traffic.workload import build_workload


def run_soak(cfg: DictConfig, run_dir: Path, overrides: list[str], choices: dict) -> int:
    conf = OmegaConf.to_object(cfg)
    if conf.engine.name != "reference":
        raise ValueError(f"a soak runs the reference engine behind its own HTTP server; engine.name="
                         f"{conf.engine.name!r} is not supported (valid: ['reference'])")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_snapshot(run_dir, build_snapshot(OmegaConf.to_container(cfg, resolve=True), overrides, choices))
    with Tracker(conf.tracking, f"soak:{conf.soak.name}:{conf.model.name}",
                 {"optladder.kind": "soak", "soak": conf.soak.name}, run_dir=run_dir) as tracker:
        backend = make_backend(conf.model, conf.engine, "inprocess", conf.faults)
        try:
            workload = build_workload(conf.workload, backend.tokenizer, conf.engine.max_model_len, conf.data.root)
            backend.warmup(warmup_requests(workload.requests[:conf.replay.warmup_requests], len(backend.tokenizer)))
            report = soak_replay(backend, workload.requests, conf.soak, run_dir, conf.model.name,
                                 conf.engine.server.host, conf.replay.request_timeout_s, conf.seed,
                                 conf.replay.progress)
            for i, w in enumerate(report["windows"]):
                tracker.log_metrics(window_metrics(w), step=i)
            tracker.set_tags({"verdict": report["verdict"]})
            print((run_dir / "soak.md").read_text())
            return 0 if report["verdict"] == "pass" else 1
        finally:
            backend.close()
