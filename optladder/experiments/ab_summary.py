"""The summary of a sweep of A/Bs (an A/A calibration above all): every verdict.json under the folders
given, summarized by optladder/abtest/sweep.py into ab_summary.md and ab_summary.json.

    python -m optladder.experiments.ab_summary multirun/2026-11-30/15-00-00 [more folders] [--out PREFIX]

A Hydra multirun of A/Bs writes the same summary into its sweep folder when it ends (optladder/experiments/callbacks.py).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import yaml

from optladder.abtest.sweep import SweepSummary, summarize, summary_markdown


def load_verdicts(folders: list[Path]) -> list[dict]:
    paths = sorted(p for f in folders for p in Path(f).rglob("verdict.json"))
    return [_with_config({**json.loads(p.read_text()), "_path": str(p)}, p.parent) for p in paths]


def _with_config(v: dict, job_dir: Path) -> dict:
    """Fill what an older verdict.json lacks (the opening arm, a gate's bound) from the job's Hydra config."""
    cfg_path = job_dir / ".hydra" / "config.yaml"
    if not cfg_path.exists() or ("first" in v and all("bound" in g for g in v["gates"])):
        return v
    cfg = yaml.safe_load(cfg_path.read_text())
    v.setdefault("first", (cfg.get("ab") or {}).get("first"))
    bounds = {("latency_max_regression", m): b for m, b in cfg["gate"].get("latency_max_regression", {}).items()}
    bounds.update({("latency_gain", m): -g for m, g in cfg["gate"].get("latency_gains", {}).items()})
    for g in v["gates"]:
        g.setdefault("bound", bounds.get((g["gate"], g["metric"])))
    return v


def write_summary(folders: list[Path], out_prefix: Path, title: str = "A/B sweep") -> SweepSummary | None:
    verdicts = load_verdicts(folders)
    if not verdicts:
        return None
    summary = summarize(verdicts)
    text = summary_markdown(summary, title)
    out_prefix.with_suffix(".md").write_text(text)
    out_prefix.with_suffix(".json").write_text(json.dumps(
        {"summary": asdict(summary), "verdicts": [v["_path"] for v in verdicts]}, indent=2, default=str))
    print(text)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, help="prefix of the .md and .json written (default: FOLDER/ab_summary)")
    ap.add_argument("--title", default="A/B sweep")
    args = ap.parse_args(argv)
    out = args.out or args.folders[0] / "ab_summary"
    if write_summary(args.folders, out, args.title) is None:
        print(f"no verdict.json under {', '.join(map(str, args.folders))}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
