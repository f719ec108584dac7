"""Pictures of one run, for people who would rather look than read: latency CDFs and KV over time."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from optladder.traffic.request import RequestRecord  # noqa: E402


def plot_run(run_dir: Path, records: list[RequestRecord], kv_points: list[tuple[float, int, int]]) -> Path | None:
    ok = [r for r in records if r.ok]
    if not ok:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for name, values in (("TTFT", [r.ttft for r in ok]), ("E2E", [r.e2e for r in ok]),
                         ("TPOT", [r.tpot for r in ok if r.tpot is not None])):
        v = np.sort(np.asarray([x for x in values if x is not None]) * 1000)
        if len(v):
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of requests")
    ax.set_title("latency CDF")
    ax.legend()
    ax = axes[1]
    if kv_points:
        t0 = kv_points[0][0]
        gib = float(1 << 30)
        ts = [p[0] - t0 for p in kv_points]
        ax.plot(ts, [p[1] / gib for p in kv_points], label="KV reserved")
        ax.plot(ts, [p[2] / gib for p in kv_points], label="KV used")
        ax.set_xlabel("s since first step")
        ax.set_ylabel("GiB")
        ax.legend()
    ax.set_title("KV cache over time")
    fig.tight_layout()
    path = Path(run_dir) / "run.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
