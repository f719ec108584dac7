"""`replay.load_levels`: after the main replay, the same requests at each load level (optladder/traffic/load_levels.py),
the per-level metrics logged under `load/*` with MLflow step = the level's index (0, 1, ...; `load/level`
holds its value), and `load_levels.json` in the run directory for the curves a ladder or sweep draws."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from optladder.experiments.report import fmt
from optladder.traffic.load_levels import level_metrics, plan_levels
from optladder.traffic.replay_config import Pacing

log = logging.getLogger(__name__)
LEVELS_FILE = "load_levels.json"


def run_levels(conf, backend, requests, run_dir: Path, tracker) -> list[dict]:
    """Replay `requests` at every level of conf.replay.load_levels; returns one dict per level."""
    wl, rc = conf.workload, conf.replay
    plans = plan_levels(requests, list(rc.load_levels), wl.arrival, wl.time_scale, wl.rate)
    out = []
    for p in plans:
        records = backend.replay(p.requests, rc, Pacing(p.mode, p.concurrency), lambda rec: None)
        metrics = {"load/level": p.value, **level_metrics(records, conf.slo)}
        tracker.log_metrics(metrics, step=p.index)
        log.info("load level %d (%s=%g): E2E p99 %.0f ms, %.1f out tok/s", p.index, p.knob, p.value,
                 metrics.get("load/e2e_ms_p99", float("nan")), metrics.get("load/throughput_out_tok_s", 0.0))
        out.append({"index": p.index, "knob": p.knob, "value": p.value, "metrics": metrics})
    (Path(run_dir) / LEVELS_FILE).write_text(json.dumps(out, indent=2))
    return out


def read_levels(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / LEVELS_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def levels_markdown(levels: list[dict]) -> str:
    """The per-level table appended to results.md; empty without levels."""
    if not levels:
        return ""
    rows = ["", f"## Load levels ({levels[0]['knob']})", "",
            "| level | TTFT p50 ms | TPOT p50 ms | E2E p99 ms | out tok/s | in flight | tok/s per user | ok / failed |",
            "|---|---|---|---|---|---|---|---|"]
    for lv in levels:
        m = lv["metrics"]
        cells = [fmt(m.get(f"load/{k}")) for k in ("ttft_ms_p50", "tpot_ms_p50", "e2e_ms_p99", "throughput_out_tok_s",
                                                    "mean_in_flight", "out_tok_s_per_user")]
        rows.append(f"| {lv['value']:g} | {' | '.join(cells)} | {fmt(m.get('load/requests_ok'))} / "
                    f"{fmt(m.get('load/requests_failed'))} |")
    return "\n".join(rows) + "\n"
