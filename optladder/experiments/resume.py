"""A ladder picked up where an earlier run of it stopped: `ladder.resume_from=<that run's directory>`.

A GPU session lends a machine for minutes at a time; a ladder of eight rungs over a real trace takes longer
than one lease. Each rung's run directory already keeps everything its gate needs (summary.json,
requests.jsonl, quality_outputs.jsonl, config_snapshot.json), so a rung that finished there is read back
instead of run again, and the ladder goes on from the first rung that did not finish. A rung is taken only
when its directory is complete for every repeat and its run used the same model, engine, workload, quality,
replay and SLO settings (the sections compared below) and replayed and scored the same data (digests);
anything else runs again, with the reason in the log.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from optladder.experiments.switchback import read_blocks
from optladder.experiments.experiment import ExperimentResult, read_traces
from optladder.traffic.request import RequestRecord

log = logging.getLogger(__name__)
SAME = ("model", "engine", "workload", "quality", "replay", "slo", "seed", "faults")
SELECTION_ONLY = ("ttft_p99_s", "tpot_p99_s")
SCORES = ("bleu", "rouge1", "rouge2", "rougeL")


def load_result(run_dir: Path) -> ExperimentResult | None:
    """The ExperimentResult a finished run left in `run_dir`, or None where it did not finish."""
    run_dir = Path(run_dir)
    summary, snap_file, recs = run_dir / "summary.json", run_dir / "config_snapshot.json", run_dir / "requests.jsonl"
    if not (summary.is_file() and snap_file.is_file() and recs.is_file()):
        return None
    s, snap = json.loads(summary.read_text()), json.loads(snap_file.read_text())
    records = [RequestRecord.from_dict(json.loads(line)) for line in recs.read_text().splitlines() if line.strip()]
    outputs: list[str] = []
    per_prompt: dict[str, list[float]] = {}
    quality = run_dir / "quality_outputs.jsonl"
    if quality.is_file():  # a repeat after the first scores no quality
        rows = [json.loads(line) for line in quality.read_text().splitlines() if line.strip()]
        outputs = [r["output"] for r in rows]
        per_prompt = {f"quality/{k}_vs_ref": [r["scores"][k] for r in rows] for k in SCORES}
    traces, why = read_traces(run_dir)
    return ExperimentResult(s["run_id"], run_dir, s["metrics"], records, outputs, per_prompt,
                            snap["requests_digest"], snap["prompts_digest"], s["opts_effective"], s["opts"], snap,
                            s.get("load_levels", []), traces, why, read_blocks(run_dir, records))


def why_not(result: ExperimentResult, resolved: dict, digests: tuple[str, str] | None) -> str | None:
    """Why an earlier result cannot stand for a run of `resolved` (None: it can)."""
    earlier = result.snapshot.get("resolved_config", {})
    changed = [k for k in SAME if _measured(k, earlier.get(k)) != _measured(k, resolved.get(k))]
    if changed:
        return f"its settings differ in {changed}"
    if digests is not None and (result.requests_digest, result.prompts_digest) != digests:
        return "it replayed or scored different data"
    return None


def _measured(section: str, value):
    """A section as far as it changes what a run measures: the SLO's level bounds (slo.ttft_p99_s,
    slo.tpot_p99_s) only choose among measurements, and runs from before they existed lack them."""
    if section == "slo" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in SELECTION_ONLY}
    return value


def resume_rung(earlier_dir: Path, name: str, repeats: int, resolved: dict, digests: tuple[str, str] | None,
                out_dir: Path) -> list[ExperimentResult] | None:
    """Every repeat of rung `name` from `earlier_dir`, copied into `out_dir`, or None to run it again."""
    results = find_rung(earlier_dir, name, repeats, resolved, digests)
    return take_rung(results, earlier_dir, name, out_dir) if results else None


def find_rung(earlier_dir: Path, name: str, repeats: int, resolved: dict, digests: tuple[str, str] | None
              ) -> list[ExperimentResult] | None:
    """Every repeat of rung `name` in `earlier_dir` when each finished with these settings and data, else None
    (nothing copied: a rung that runs again must not find the earlier records in its directory)."""
    results = []
    for r in range(repeats):
        src = Path(earlier_dir) / f"{name}-r{r}"
        res = load_result(src)
        if res is None:
            log.info("resume: %s runs again (%s did not finish)", name, src)
            return None
        reason = why_not(res, resolved, digests)
        if reason:
            log.warning("resume: %s runs again: %s", name, reason)
            return None
        results.append(res)
    return results


def take_rung(results: list[ExperimentResult], earlier_dir: Path, name: str, out_dir: Path
              ) -> list[ExperimentResult]:
    """find_rung's runs copied into `out_dir` (this run directory stays whole)."""
    for r, res in enumerate(results):
        dest = Path(out_dir) / f"{name}-r{r}"
        if dest.resolve() != res.run_dir.resolve():
            shutil.copytree(res.run_dir, dest, dirs_exist_ok=True)
        res.run_dir = dest
    log.info("resume: %s taken from %s (run %s)", name, earlier_dir, results[0].run_id)
    return results
