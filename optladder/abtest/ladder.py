"""A ladder's logic on plain data: which opts a rung runs, whether a verdict keeps it, and the ladder's
table (docs/design.md's: baseline vs all on, and per rung) and chart. optladder/experiments/ladder_run.py runs the rungs.

A rung adds one opt to the last accepted rung and is gated against it; a rung that fails is reported and
left out of the rungs after it, an undecided one is kept (flagged) when `keep_inconclusive` says so."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

from optladder.abtest.run_pairs import run_noise_from_aa

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROWS = (("TTFT p50 (ms)", "perf/ttft_ms_p50"), ("TPOT p50 (ms)", "perf/tpot_ms_p50"),
        ("E2E p99 (ms)", "perf/e2e_ms_p99"), ("throughput (out tok/s)", "perf/throughput_out_tok_s"),
        ("capacity at P99 ≤ SLO (concurrency)", "capacity/max_concurrency"),
        ("peak memory (GiB)", "perf/peak_mem_gb"), ("KV reserved (GiB)", "perf/kv_reserved_gb"),
        ("KV utilization", "perf/kv_util"), ("BLEU vs references", "quality/bleu_vs_ref"),
        ("ROUGE-L vs references", "quality/rougeL_vs_ref"))

# a rung beside its control's run (ladder.interleave): the timed figures
BESIDE = (("TTFT p50 (ms)", "perf/ttft_ms_p50"), ("TPOT p50 (ms)", "perf/tpot_ms_p50"),
          ("E2E p99 (ms)", "perf/e2e_ms_p99"), ("throughput (out tok/s)", "perf/throughput_out_tok_s"))


def noise_beside(rungs: list[dict], keys: tuple[str, ...] | None = None) -> dict[str, tuple[float, int, float]]:
    """Run-to-run noise measured inside an interleaved ladder: each control run beside a rung is the same config
    as that control's own run, minutes apart (an A/A pair). Figure (keys; default the timed ones, BESIDE's) -> (RMS
    of ln(run beside / own run): the SD of the log ratio of two identical runs, pairs, mean log ratio), over the pairs
    with both positive. The control of rung i is the rung accepted before it (the row before's accepted_rung). From
    ladder.json's rows, so whole-run figures and every pair; the gates' own pooling (ladder.pool_noise) pairs the
    requests ok in both runs and leaves out pairs across environments or read back against made here."""
    by_rung = {r["rung"]: r for r in rungs}
    logs: dict[str, list[float]] = {key: [] for key in ([key for _, key in BESIDE] if keys is None else keys)}
    for before, r in zip(rungs, rungs[1:]):
        own = by_rung.get(before.get("accepted_rung"), {}).get("metrics", {})
        again = (r.get("control_beside") or {}).get("metrics", {})
        for key in logs:
            a, b = own.get(key), again.get(key)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0:
                logs[key].append(math.log(b / a))
    return {key: (*run_noise_from_aa(x), sum(x) / len(x)) for key, x in logs.items() if x}


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}")


def _change(a, b) -> str:
    return "-" if a in (None, 0) or b is None else f"{(b - a) / a:+.1%}"


LOADED = 0.8


def load(metrics: dict) -> float | None:
    """The rung's load, estimated: the output tokens per second the trace offered (its requests' output tokens over
    its arrival span; every request answered, so out tok/s served x makespan / span) times the time a decode-only
    step took per decode row (stage/decode_ms_mean over perf/step_decode_tokens_mean). About 1 means the engine
    needed all of the trace's time for its decode rows. It assumes a row costs the same at any batch, as in a
    per-row-bound eager step; a step with a large fixed cost (graph replay at a few rows) reads high. None without
    the figures (a closed-loop workload has no arrival span; an engine without stage timers)."""
    span, makespan = metrics.get("traffic/duration_s"), metrics.get("perf/makespan_s")
    served, per_row = metrics.get("perf/throughput_out_tok_s"), row_ms(metrics)
    if per_row is None or not all(isinstance(v, (int, float)) and v > 0 for v in (span, makespan, served)):
        return None
    return served * makespan / span * per_row / 1000


def row_ms(metrics: dict) -> float | None:
    """The ms a decode-only step took per decode row (stage/decode_ms_mean over perf/step_decode_tokens_mean): the
    engine's own speed at the rows it ran, apart from how long its requests queued. None without the figures."""
    step_ms, rows = metrics.get("stage/decode_ms_mean"), metrics.get("perf/step_decode_tokens_mean")
    ok = all(isinstance(v, (int, float)) and v > 0 for v in (step_ms, rows))
    return step_ms / rows if ok else None


def ladder_table(rungs: list[dict]) -> str:
    base, final = rungs[0], rungs[rungs[-1]["accepted_rung"]]
    base_metrics, base_name = base["metrics"], "baseline"
    beside = rungs[1].get("control_beside") if len(rungs) > 1 else None
    if final.get("blocks") and beside and beside.get("metrics"):
        # a switchback ladder: the last accepted rung was replayed in blocks, each starting with no queue, the
        # baseline's own run as one whole trace; the baseline beside rung 1 (the same config, in the same blocks)
        # is what the rung compares with (a whole run queues up where blocks do not: TTFT 1.4 s against 61 ms)
        # (its quality is the baseline's own: the run beside scores no prompts, and answers do not queue)
        base_metrics = {**beside["metrics"], **{k: v for k, v in base["metrics"].items() if k.startswith("quality/")}}
        base_name = "baseline (beside rung 1, in blocks)"
    head = f"| metric | {base_name} | all on ({'+'.join(final['opts']) or 'none'}) | change |"
    lines = [head, "|---|---|---|---|"]
    for label, key in ROWS:
        a, b = base_metrics.get(key), final["metrics"].get(key)
        lines.append(f"| {label} | {_fmt(a)} | {_fmt(b)} | {_change(a, b)} |")
    # agreement, not a change: the last accepted rung's answers scored against its control's (100 / 1: the same)
    lines.append(f"| BLEU / ROUGE-L vs its control's answers (last accepted rung) | - | "
                 f"{_fmt(final['metrics'].get('quality/bleu_vs_control'))} / "
                 f"{_fmt(final['metrics'].get('quality/rougeL_vs_control'))} | - |")
    lines += ["", "| rung | opt added | verdict | TTFT p50 | TPOT p50 | E2E p99 | peak mem GiB | exact match vs prev |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rungs:
        m = r["metrics"]
        lines.append(f"| {r['rung']} | {r['opt'] or 'baseline'} | {r['status']} | {_fmt(m.get('perf/ttft_ms_p50'))} | "
                     f"{_fmt(m.get('perf/tpot_ms_p50'))} | {_fmt(m.get('perf/e2e_ms_p99'))} | "
                     f"{_fmt(m.get('perf/peak_mem_gb'))} | {_fmt(m.get('quality/exact_match_vs_control'))} |")
    paired = [r for r in rungs if r.get("control_beside")]
    if paired:
        lines += ["", "Each rung against its control run beside it (ladder.interleave: the figures its latency gates "
                  "compared; control -> rung, change):", "",
                  "| rung | opt added | control run beside it | " + " | ".join(label for label, _ in BESIDE) + " |",
                  "|---|---|---|" + "---|" * len(BESIDE)]
        for r in paired:
            c, m = r["control_beside"]["metrics"], r["metrics"]
            lines.append(f"| {r['rung']} | {r['opt']} | {r['control_beside']['name']} | " + " | ".join(
                f"{_fmt(c.get(key))} -> {_fmt(m.get(key))} ({_change(c.get(key), m.get(key))})" for _, key in BESIDE)
                + " |")
        noise = noise_beside(rungs)
        if noise:
            lines += ["", "Run-to-run noise measured beside the rungs (each control's run beside a rung against its "
                      "own run, the same config minutes apart; RMS of the log ratio over n pairs, its mean; the "
                      "latency gates assume gate.run_noise): " + "; ".join(
                          f"{label} {sd:.3f} (n={n}, mean {mean:+.3f})" for label, key in BESIDE if key in noise
                          for sd, n, mean in [noise[key]])]
            last = next((r["run_noise_pooled"] for r in reversed(rungs) if r.get("run_noise_pooled")), None)
            if last:
                lines.append("The latency gates pooled them with gate.run_noise (ladder.pool_noise), at the last rung: "
                             + "; ".join(f"{m} prior {u['prior']:.3f} x {u['prior_weight']:g} with {u['pairs']} "
                                         f"pair(s) (RMS {u['aa_rms']:.3f}) -> {u['pooled']:.3f}"
                                         for m, u in last.items()))
    loads = [(f"rung {r['rung']}", load(r["metrics"])) for r in rungs]
    loads += [(f"its control beside rung {r['rung']}", load(r["control_beside"].get("metrics", {})))
              for r in rungs if r.get("control_beside")]
    if any(x is not None and x >= LOADED for _, x in loads):
        lines += ["", "Load, estimated (the trace's offered output tokens per second x the seconds a decode step took "
                  "per row; 1 = the engine needed all of the trace's time for its decode rows): " + ", ".join(
                      f"{name} {x:.2f}" for name, x in loads if x is not None) + f". A run at {LOADED:g} or more "
                  "was at or near its capacity: its queue amplifies small differences in step time into large ones "
                  "in latency, so two runs of it can differ by far more than gate.run_noise, and a rung judged "
                  "against it can get another verdict in the next run. Where a step's cost follows its rows, a "
                  "larger workload.time_scale lowers the load (benchmarks/results/gpu_ladder_h200/smollm2.md)."]
    elsewhere = [f"- rung {r['rung']} (+{r['opt']}): {'; '.join(r['environment_vs_baseline'][:4])}"
                 for r in rungs if r.get("environment_vs_baseline")]
    if elsewhere:
        lines += ["", "Rungs measured in another environment than the baseline (a resumed ladder): their latency "
                  "against the baseline's above mixes the switches with the environments' difference "
                  "(optladder/abtest/environment.py):", *elsewhere]
    errors = [f"- rung {r['rung']} (+{r['opt']}): {r['reason']}" for r in rungs if r["status"] == "error"]
    if errors:
        lines += ["", "Rungs that raised, left out (their run directories hold error.txt):", *errors]
    return "\n".join(lines)


def ladder_chart(rungs: list[dict], path: Path) -> Path:
    labels = [r["opt"] or "baseline" for r in rungs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    for name, key in (("TTFT p50", "perf/ttft_ms_p50"), ("TPOT p50", "perf/tpot_ms_p50"),
                      ("E2E p50", "perf/e2e_ms_p50"), ("E2E p99", "perf/e2e_ms_p99")):
        ax1.plot(labels, [r["metrics"].get(key, float("nan")) for r in rungs], marker="o", label=name)
    ax1.set_yscale("log")
    ax1.set_ylabel("ms")
    ax1.set_title("latency per rung")
    ax1.legend()
    for name, key in (("peak memory", "perf/peak_mem_gb"), ("KV reserved", "perf/kv_reserved_gb"),
                      ("KV used", "perf/kv_used_gb")):
        ax2.plot(labels, [r["metrics"].get(key, float("nan")) for r in rungs], marker="s", label=name)
    ax2.set_ylabel("GiB")
    ax2.set_title("memory per rung")
    ax2.legend()
    for ax, r in ((ax1, rungs), (ax2, rungs)):
        for i, rung in enumerate(r):
            if rung["status"] == "fail":
                ax.axvspan(i - 0.3, i + 0.3, color="red", alpha=0.1)
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def rung_opts(accepted: list[str], opt: str) -> list[str]:
    """The opts a rung runs with: every accepted one so far, plus its own."""
    return [*accepted, opt]


def keeps(status: str, keep_inconclusive: bool) -> bool:
    """Whether a rung's verdict admits its opt into the rungs after it."""
    return status == "pass" or (status == "inconclusive" and keep_inconclusive)
