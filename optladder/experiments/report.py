"""The short results table printed at the end of a run, and results.md. Both end with what the replay did
not keep of its trace (traffic.workload.departures), so a number is never read as the trace's when it is not."""
from __future__ import annotations

from optladder.experiments.tracking import resolve_uri
from optladder.traffic.workload import departures

ROWS = (("TTFT p50 / p99 (ms)", "perf/ttft_ms_p50", "perf/ttft_ms_p99"),
        ("TPOT p50 / p99 (ms)", "perf/tpot_ms_p50", "perf/tpot_ms_p99"),
        ("E2E p50 / p99 (ms)", "perf/e2e_ms_p50", "perf/e2e_ms_p99"),
        ("throughput (req/s, out tok/s)", "perf/throughput_req_s", "perf/throughput_out_tok_s"),
        ("requests ok / failed", "perf/requests_ok", "perf/requests_failed"),
        ("peak memory / KV reserved (GiB)", "perf/peak_mem_gb", "perf/kv_reserved_gb"),
        ("KV utilization", "perf/kv_util", None),
        ("lateness p50 / p99 (ms)", "perf/lateness_ms_p50", "perf/lateness_ms_p99"),
        ("KS input length: replayed / trace", "traffic/ks_input_len", "traffic/ks_input_len_trace"),
        ("KS output length: replayed / trace", "traffic/ks_output_len", "traffic/ks_output_len_trace"),
        ("BLEU / ROUGE-L vs ref", "quality/bleu_vs_ref", "quality/rougeL_vs_ref"),
        ("load / start (s)", "perf/load_s", "perf/start_s"))


def fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"


PREFIX_ROW = ("prefix hits: trace/replayed/engine", "traffic/prefix_hit_rate_trace", "traffic/prefix_hit_rate_replayed",
              "perf/prefix_hit_rate")


def _rows(metrics: dict[str, float]):
    """(label, value text) per row. A traffic row whose metrics the run did not log (KS of the builtin workload) is
    left out; every other row shows '-' for what was not measured. Hash-block traces add the prefix-cache hit rate
    their hash ids promise (over the sample, and as replayed) beside the engine's own, where it has one."""
    for label, a, b in ROWS:
        if a.startswith("traffic/") and a not in metrics:
            continue
        yield label, fmt(metrics.get(a)) + ("" if b is None else f" / {fmt(metrics.get(b))}")
    if PREFIX_ROW[1] in metrics:
        yield PREFIX_ROW[0], " / ".join(fmt(metrics.get(k)) for k in PREFIX_ROW[1:])


def results_table(metrics: dict[str, float], title: str) -> str:
    lines = [title, "-" * len(title)]
    lines += [f"{label:<34} {vals}" for label, vals in _rows(metrics)]
    lines += [f"warning: {msg}" for msg in departures(metrics).values()]
    return "\n".join(lines)


def results_markdown(metrics: dict[str, float], title: str) -> str:
    """The headline table in Markdown: results.md, an artifact of every run."""
    lines = [f"# {title}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {label} | {vals} |" for label, vals in _rows(metrics)]
    notes = departures(metrics)
    if notes:
        lines += ["", "**Not the trace's traffic:**", ""] + [f"- {msg} (tag `{tag}=true`)" for tag, msg in notes.items()]
    return "\n".join(lines) + "\n"


def footer(run_id: str | None, run_dir, tracking_cfg) -> str:
    lines = [f"run directory: {run_dir}"]
    if run_id:
        lines.append(f"MLflow run: {run_id}")
        lines.append(f"open the UI: mlflow ui --backend-store-uri {resolve_uri(tracking_cfg.uri)}")
    return "\n".join(lines)
