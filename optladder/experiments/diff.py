"""Print what differs between the snapshots of two runs: config, overrides, environment, digests, and the
headline metrics side by side, to find which change moved a number.

    python -m optladder.experiments.diff RUN_A RUN_B        (MLflow run ids, or run directories)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from optladder.experiments.snapshot import SNAPSHOT_FILE
from optladder.experiments.tracking import flatten, resolve_uri

HEADLINE = ("perf/ttft_ms_p50", "perf/tpot_ms_p50", "perf/e2e_ms_p99", "perf/throughput_out_tok_s",
            "perf/peak_mem_gb", "perf/kv_reserved_gb", "quality/bleu_vs_ref", "quality/rougeL_vs_ref")


def load_run(ref: str, tracking_uri: str) -> tuple[dict, dict]:
    """(snapshot, summary) of a run directory or an MLflow run id."""
    path = Path(ref)
    if path.is_dir():
        snap = path / SNAPSHOT_FILE
        if not snap.exists():
            raise FileNotFoundError(f"{path} holds no {SNAPSHOT_FILE}: not an optladder run directory")
        summary = path / "summary.json"
        return json.loads(snap.read_text()), json.loads(summary.read_text()) if summary.exists() else {}
    import mlflow
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(resolve_uri(tracking_uri))
    try:
        local = Path(mlflow.artifacts.download_artifacts(run_id=ref))
    except MlflowException as e:
        raise FileNotFoundError(f"{ref!r} is neither a run directory nor a run id in {tracking_uri}: {e}") from e
    return load_run(str(local), tracking_uri)


def diff_dicts(a: dict, b: dict) -> list[tuple[str, str, str]]:
    fa, fb = flatten(a), flatten(b)
    return [(k, fa.get(k, "<absent>"), fb.get(k, "<absent>"))
            for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def render(a_ref: str, b_ref: str, a: tuple[dict, dict], b: tuple[dict, dict]) -> str:
    (sa, ma), (sb, mb) = a, b
    out = [f"A: {a_ref}", f"B: {b_ref}", ""]
    sections = (("config", sa.get("resolved_config", {}), sb.get("resolved_config", {})),
                ("environment", sa.get("environment", {}), sb.get("environment", {})),
                ("overrides", {"overrides": sa.get("overrides")}, {"overrides": sb.get("overrides")}),
                ("digests", {k: sa.get(k) for k in ("requests_digest", "prompts_digest")},
                 {k: sb.get(k) for k in ("requests_digest", "prompts_digest")}))
    for title, da, db in sections:
        rows = [r for r in diff_dicts(da, db) if r[0] != "created_at"]
        out.append(f"## {title}: {len(rows)} difference(s)")
        out += [f"  {k}: {va}  ->  {vb}" for k, va, vb in rows]
        out.append("")
    metrics_a, metrics_b = ma.get("metrics", {}), mb.get("metrics", {})
    if metrics_a or metrics_b:
        out.append("## headline metrics (A -> B)")
        for k in HEADLINE:
            va, vb = metrics_a.get(k), metrics_b.get(k)
            if va is None and vb is None:
                continue
            change = f"  ({(vb - va) / va:+.1%})" if va and vb is not None else ""
            out.append(f"  {k}: {va}  ->  {vb}{change}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    args = p.parse_args(argv)
    try:
        a, b = load_run(args.run_a, args.tracking_uri), load_run(args.run_b, args.tracking_uri)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(args.run_a, args.run_b, a, b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
