"""What a run shows a person: the results table printed at the end, its footer, and the run's picture."""
from __future__ import annotations

import matplotlib.image as mpimg

from optladder.experiments.plots import plot_run
from optladder.experiments.report import footer, results_table
from optladder.experiments.schema import TrackingConfig
from optladder.experiments.tracking import resolve_uri
from optladder.traffic.request import RequestRecord


def test_results_table_formats_what_was_measured_and_dashes_the_rest():
    table = results_table({"perf/ttft_ms_p50": 12.3456, "perf/ttft_ms_p99": 12345.6, "perf/requests_ok": 32,
                           "perf/requests_failed": 0, "perf/kv_util": 0.5}, "optladder: baseline on tiny")
    lines = table.splitlines()
    assert lines[0] == "optladder: baseline on tiny" and lines[1] == "-" * len(lines[0])
    rows = {line[:34].strip(): line[34:].strip() for line in lines[2:]}
    assert rows["TTFT p50 / p99 (ms)"] == "12.35 / 12,346"  # 4 significant digits; thousands separated
    assert rows["requests ok / failed"] == "32 / 0"
    assert rows["KV utilization"] == "0.5"
    assert rows["TPOT p50 / p99 (ms)"] == "- / -"  # not measured: a dash, never 0


def test_footer_points_at_the_run_and_the_ui_only_when_tracked(tmp_path):
    tracked = footer("abc123", tmp_path, TrackingConfig(uri="sqlite:///mlflow.db"))
    assert f"run directory: {tmp_path}" in tracked and "MLflow run: abc123" in tracked
    assert f"mlflow ui --backend-store-uri {resolve_uri('sqlite:///mlflow.db')}" in tracked
    assert resolve_uri("sqlite:///mlflow.db").endswith("/mlflow.db") and resolve_uri("sqlite:///mlflow.db") != \
        "sqlite:///mlflow.db"  # taken from the project root, so every run lands in one database
    assert footer(None, tmp_path, TrackingConfig()) == f"run directory: {tmp_path}"


def record(i: int, ok: bool = True) -> RequestRecord:
    t = [0.1 * i + 0.05 * k for k in range(1, 5)]
    return RequestRecord(f"r{i}", 0.0, 8, 4, sent_at=0.0, first_token_at=t[0], finished_at=t[-1],
                         output_tokens=4, token_times=t, ok=ok)


def test_run_picture_has_both_panels_and_is_skipped_without_a_finished_request(tmp_path):
    path = plot_run(tmp_path, [record(i) for i in range(1, 6)], [(0.0, 1 << 30, 1 << 29), (1.0, 1 << 30, 3 << 28)])
    assert path == tmp_path / "run.png"
    height, width, _ = mpimg.imread(path).shape
    assert (width, height) == (1100, 400)  # 11 x 4 inches at 100 dpi: latency CDFs beside KV over time
    assert plot_run(tmp_path / "none", [record(1, ok=False)], []) is None
    assert not (tmp_path / "none" / "run.png").exists()


CLIPPED = {"traffic/ks_input_len": 0.376, "traffic/ks_input_len_trace": 0.023, "traffic/ks_output_len": 0.01,
           "traffic/ks_output_len_trace": 0.01, "traffic/changed_input_share": 0.39, "traffic/changed_output_share": 0.0}


def test_results_say_when_the_replay_does_not_have_the_traces_lengths():
    from optladder.experiments.report import results_markdown

    table = results_table(CLIPPED, "t")
    rows = {line[:34].strip(): line[34:].strip() for line in table.splitlines()[2:]}
    assert rows["KS input length: replayed / trace"] == "0.376 / 0.023"
    assert table.splitlines()[-1] == (
        "warning: the length policy changed 39% of the input lengths and 0% of the output lengths (more than 5%): "
        "the replay does not have the trace's lengths; KS distance to the trace of the lengths as replayed 0.376 "
        "(input) / 0.010 (output), of the sample before fitting 0.023 / 0.010")
    md = results_markdown(CLIPPED, "t")
    assert "| KS input length: replayed / trace | 0.376 / 0.023 |" in md
    assert "**Not the trace's traffic:**" in md and "39% of the input lengths" in md
    assert "(tag `optladder.lengths_changed=true`)" in md
    kept = {**CLIPPED, "traffic/changed_input_share": 0.02}
    assert "warning" not in results_table(kept, "t") and "Not the trace" not in results_markdown(kept, "t")
    assert "KS input" not in results_table({"perf/kv_util": 0.5}, "t")  # builtin: no trace, no KS row


def test_prefix_reuse_of_the_trace_stands_beside_the_engines():
    from optladder.experiments.report import results_markdown

    reuse = {"traffic/prefix_hit_rate_trace": 0.114, "traffic/prefix_hit_rate_replayed": 0.8}
    md = results_markdown({**reuse, "perf/prefix_hit_rate": 0.75}, "t")
    assert "| prefix hits: trace/replayed/engine | 0.114 / 0.8 / 0.75 |" in md
    assert "fitting the lengths moved the prefix-cache hit rate" in md
    assert "(tag `optladder.prefix_reuse_changed=true`)" in md
    rows = {line[:34].strip(): line[34:].strip() for line in results_table(reuse, "t").splitlines()[2:]}
    assert rows["prefix hits: trace/replayed/engine"] == "0.114 / 0.8 / -"  # prefix_cache off: no engine figure
    assert "prefix hits" not in results_table({"perf/prefix_hit_rate": 0.5}, "t")
