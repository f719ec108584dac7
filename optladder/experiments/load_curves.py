"""The latency-throughput curve of each config and the Pareto frontier of output tok/s per user against
output tok/s per GPU, over every config and load level of a ladder or a sweep: `load_curves.png`,
`pareto.md` and `pareto.json`, artifacts of the parent run. A point is on the frontier when no other point
is at least as good on both axes and better on one."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

USER, GPU = "load/out_tok_s_per_user", "load/out_tok_s_per_gpu"


def points(curves: dict[str, list[dict]]) -> list[dict]:
    """One point per (config, level) with both axes measured."""
    out = []
    for config, levels in curves.items():
        for lv in levels:
            m = lv["metrics"]
            if m.get(USER, 0) > 0 and m.get(GPU, 0) > 0:
                out.append({"config": config, "knob": lv["knob"], "level": lv["value"], "per_user": m[USER],
                            "per_gpu": m[GPU], "e2e_ms_p99": m.get("load/e2e_ms_p99")})
    return out


def pareto_frontier(pts: list[dict]) -> list[dict]:
    """The points no other point dominates, by tok/s per user ascending."""
    def dominated(p: dict) -> bool:
        return any(q["per_user"] >= p["per_user"] and q["per_gpu"] >= p["per_gpu"]
                   and (q["per_user"] > p["per_user"] or q["per_gpu"] > p["per_gpu"]) for q in pts)

    return sorted((p for p in pts if not dominated(p)), key=lambda p: p["per_user"])


def write_load_curves(curves: dict[str, list[dict]], out_dir: Path) -> list[Path]:
    """curves: config name -> its levels (optladder/experiments/levels.py). Nothing is written without levels."""
    pts = points(curves)
    if not pts:
        return []
    front = pareto_frontier(pts)
    out_dir = Path(out_dir)
    (out_dir / "pareto.json").write_text(json.dumps({"points": pts, "frontier": front}, indent=2))
    lines = ["| config | load level | out tok/s per user | out tok/s per GPU | E2E p99 ms |", "|---|---|---|---|---|"]
    lines += [f"| {p['config']} | {p['knob']}={p['level']:g} | {p['per_user']:.3g} | {p['per_gpu']:.4g} | "
              f"{p['e2e_ms_p99']:.0f} |" for p in front]
    (out_dir / "pareto.md").write_text("Pareto frontier (no other config and level is better on both axes)\n\n"
                                       + "\n".join(lines) + "\n")
    _chart(curves, pts, front, out_dir / "load_curves.png")
    return [out_dir / "pareto.json", out_dir / "pareto.md", out_dir / "load_curves.png"]


def _chart(curves: dict[str, list[dict]], pts: list[dict], front: list[dict], path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for config, levels in curves.items():
        xs = [lv["metrics"].get("load/throughput_out_tok_s") for lv in levels]
        ys = [lv["metrics"].get("load/e2e_ms_p99") for lv in levels]
        keep = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        if keep:
            ax1.plot(*zip(*keep), marker="o", label=config)
    ax1.set_xlabel("output tok/s")
    ax1.set_ylabel("E2E p99 (ms)")
    ax1.set_yscale("log")
    ax1.set_title("latency vs throughput, one point per load level")
    ax1.legend(fontsize=8)
    for config in curves:
        mine = [p for p in pts if p["config"] == config]
        ax2.scatter([p["per_user"] for p in mine], [p["per_gpu"] for p in mine], alpha=0.6, label=config)
    ax2.plot([p["per_user"] for p in front], [p["per_gpu"] for p in front], color="black", marker="o",
             linewidth=1, label="Pareto frontier")
    ax2.set_xlabel("output tok/s per user")
    ax2.set_ylabel("output tok/s per GPU")
    ax2.set_title("Pareto frontier")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
