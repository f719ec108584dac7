"""The short results table printed at the end of a run."""
from __future__ import annotations

from optladder.experiments.tracking import resolve_uri

ROWS = (("TTFT p50 / p99 (ms)", "perf/ttft_ms_p50", "perf/ttft_ms_p99"),
        ("TPOT p50 / p99 (ms)", "perf/tpot_ms_p50", "perf/tpot_ms_p99"),
        ("E2E p50 / p99 (ms)", "perf/e2e_ms_p50", "perf/e2e_ms_p99"),
        ("throughput (req/s, out tok/s)", "perf/throughput_req_s", "perf/throughput_out_tok_s"),
        ("requests ok / failed", "perf/requests_ok", "perf/requests_failed"),
        ("peak memory / KV reserved (GiB)", "perf/peak_mem_gb", "perf/kv_reserved_gb"),
        ("KV utilization", "perf/kv_util", None),
        ("lateness p50 / p99 (ms)", "perf/lateness_ms_p50", "perf/lateness_ms_p99"),
        ("BLEU / ROUGE-L vs ref", "quality/bleu_vs_ref", "quality/rougeL_vs_ref"),
        ("load / start (s)", "perf/load_s", "perf/start_s"))


def fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def results_table(metrics: dict[str, float], title: str) -> str:
    lines = [title, "-" * len(title)]
    for label, a, b in ROWS:
        vals = fmt(metrics.get(a)) + ("" if b is None else f" / {fmt(metrics.get(b))}")
        lines.append(f"{label:<34} {vals}")
    return "\n".join(lines)


def results_markdown(metrics: dict[str, float], title: str) -> str:
    """The headline table in Markdown: results.md, an artifact of every run."""
    lines = [f"# {title}", "", "| metric | value |", "|---|---|"]
    for label, a, b in ROWS:
        lines.append(f"| {label} | {fmt(metrics.get(a))}{'' if b is None else ' / ' + fmt(metrics.get(b))} |")
    return "\n".join(lines) + "\n"


def footer(run_id: str | None, run_dir, tracking_cfg) -> str:
    lines = [f"run directory: {run_dir}"]
    if run_id:
        lines.append(f"MLflow run: {run_id}")
        lines.append(f"open the UI: mlflow ui --backend-store-uri {resolve_uri(tracking_cfg.uri)}")
    return "\n".join(lines)
