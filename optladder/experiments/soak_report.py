"""A soak's report for people: soak.md (gates, bad requests by kind, the windows) and soak.png (memory,
KV blocks, latency percentiles and traffic per window)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from optladder.abtest.soak import Sample, Window  # noqa: E402


def soak_markdown(report: dict) -> str:
    lines = [f"## Soak {report['soak']}: {report['verdict'].upper()}", "",
             f"{report['duration_s'] / 60:.1f} min, {report['requests']} requests, {report['bad_requests']} bad "
             f"requests, {report['aborted']} sequences aborted for clients that hung up", "",
             "| gate | status | numbers |", "|---|---|---|"]
    lines += [f"| {g['name']} | {g['status']} | {g['reason']} |" for g in report["gates"]]
    if report["bad_by_kind"]:
        lines += ["", "| bad request | sent | expected | answers | right |", "|---|---|---|---|---|"]
        lines += [f"| {b['kind']} | {b['sent']} | {b['expected']} | "
                  f"{', '.join(f'{k}: {v}' for k, v in sorted(b['answers'].items()))} | {b['right']} |"
                  for b in report["bad_by_kind"]]
    lines += ["", "| window | requests | errors | bad | RSS / anon MiB | KV used / free blocks | TTFT p99 ms | TPOT p99 ms | "
              "E2E p50 ms | E2E p99 ms | E2E p99.9 ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in report["windows"]:
        lat = w["latency_ms"]
        cell = [f"{lat[k]:,.0f}" if k in lat else "-" for k in ("ttft_p99", "tpot_p99", "e2e_p50", "e2e_p99",
                                                                  "e2e_p999")]
        lines.append(f"| {w['index']} | {w['requests']} | {w['errors']} | {sum(w['bad'].values())} | "
                     f"{w['rss_mib']:,.1f} / {w['anon_mib']:,.1f} | {w['kv_used_blocks']} / {w['kv_free_blocks']} | "
                     f"{' | '.join(cell)} |")
    return "\n".join(lines) + "\n"


def plot_soak(path: Path, wins: list[Window], samples: list[Sample]) -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    t = [s.t / 60 for s in samples]
    ax = axes[0][0]
    ax.plot(t, [s.rss_mib for s in samples], label="resident (RSS)")
    ax.plot(t, [s.anon_mib for s in samples], label="anonymous resident")
    if any(s.device_mib is not None for s in samples):
        ax.plot(t, [s.device_mib or 0 for s in samples], label="device allocated")
    ax.set(title="memory", xlabel="min", ylabel="MiB")
    ax.legend()
    ax = axes[0][1]
    ax.plot(t, [s.kv_used_blocks for s in samples], label="in use")
    ax.plot(t, [s.kv_free_blocks for s in samples], label="free")
    ax.set(title="KV blocks", xlabel="min", ylabel="blocks")
    ax.legend()
    ax = axes[1][0]
    x = [w.start_s / 60 for w in wins]
    for key, label in (("e2e_p50", "E2E p50"), ("e2e_p99", "E2E p99"), ("e2e_p999", "E2E p99.9"),
                       ("ttft_p99", "TTFT p99")):
        ax.plot(x, [w.latency_ms.get(key, float("nan")) for w in wins], marker=".", label=label)
    ax.set(title="latency per window", xlabel="min", ylabel="ms")
    ax.legend()
    ax = axes[1][1]
    ax.bar(x, [w.requests for w in wins], width=0.8 * (x[1] - x[0]) if len(x) > 1 else 0.8, label="requests")
    ax.plot(x, [sum(w.bad.values()) for w in wins], "k.", label="bad requests")
    ax.plot(x, [w.errors for w in wins], "rx", label="errors")
    ax.set(title="traffic per window", xlabel="min")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
