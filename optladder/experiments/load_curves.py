"""The latency-throughput curve of each config and the Pareto frontier of output tok/s per user against
output tok/s per GPU, over every config and load level of a ladder or a sweep: `load_curves.png`,
`pareto.md` and `pareto.json`, artifacts of the parent run. A point is on the frontier when no other point
is at least as good on both axes and better on one. A sweep adds its best config under the SLO (marked on the
chart) and the A/B that gates it against the defaults (optladder/experiments/slo_pick.py)."""
from __future__ import annotations

import json
import math
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


def write_load_curves(curves: dict[str, list[dict]], out_dir: Path, pick: dict | None = None,
                      gate: dict | None = None) -> list[Path]:
    """curves: config name -> its levels (optladder/experiments/levels.py). Nothing is written without levels.
    pick: slo_pick.best_under_slo of the same curves; gate: slo_pick.gate of its best (both optional)."""
    pts = points(curves)
    if not pts:
        return []
    front = pareto_frontier(pts)
    out_dir = Path(out_dir)
    doc = {"points": pts, "frontier": front}
    if pick is not None:
        doc.update(slo=pick["slo"], best=pick["best"], runner_up=pick["runner_up"], margin_tok_s=pick["margin_tok_s"],
                   margin_pct=pick["margin_pct"], tied=pick["tied"], closest=pick["closest"],
                   slo_points=pick["configs"], slo_levels=pick["levels"], best_summary=pick["summary"])
    if gate is not None:
        doc["gate"] = gate
    (out_dir / "pareto.json").write_text(json.dumps(_finite(doc), indent=2, default=str))
    lines = ["| config | load level | out tok/s per user | out tok/s per GPU | E2E p99 ms |", "|---|---|---|---|---|"]
    lines += [f"| {p['config']} | {p['knob']}={p['level']:g} | {p['per_user']:.3g} | {p['per_gpu']:.4g} | "
              f"{p['e2e_ms_p99']:.0f} |" for p in front]
    text = "Pareto frontier (no other config and level is better on both axes)\n\n" + "\n".join(lines) + "\n"
    if pick is not None:
        from optladder.experiments.slo_pick import gate_markdown, markdown

        text += markdown(pick) + (gate_markdown(gate) if gate is not None else "")
    (out_dir / "pareto.md").write_text(text)
    _chart(curves, pts, front, out_dir / "load_curves.png", pick)
    return [out_dir / "pareto.json", out_dir / "pareto.md", out_dir / "load_curves.png"]


def _finite(v):
    """JSON has no infinity: a ratio to a bound of an unmeasured p99 is written as null."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _chart(curves: dict[str, list[dict]], pts: list[dict], front: list[dict], path: Path,
           pick: dict | None = None) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.5))
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
    for config in curves:
        mine = [p for p in pts if p["config"] == config]
        ax2.scatter([p["per_user"] for p in mine], [p["per_gpu"] for p in mine], alpha=0.6, label=config)
    ax2.plot([p["per_user"] for p in front], [p["per_gpu"] for p in front], color="black", marker="o",
             linewidth=1, label="Pareto frontier")
    mark = pick and (pick["best"] or pick["closest"])
    if mark:
        best = pick["best"] is not None
        label = "best under the SLO" if best else "closest to the SLO (misses it)"
        style = dict(marker="*" if best else "X", s=260, color="gold" if best else "red", edgecolors="black",
                     zorder=5, label=label)
        if mark["throughput"] and mark["e2e_ms_p99"]:
            ax1.scatter([mark["throughput"]], [mark["e2e_ms_p99"]], **style)
        if mark["per_user"] > 0 and mark["per_gpu"] > 0:
            ax2.scatter([mark["per_user"]], [mark["per_gpu"]], **style)
        fig.suptitle(f"SLO {pick['slo_text']}\n{label}: {mark['config']} at {mark['knob']}={mark['level']:g}",
                     fontsize=9)
    ax2.set_xlabel("output tok/s per user")
    ax2.set_ylabel("output tok/s per GPU")
    ax2.set_title("Pareto frontier")
    for ax in (ax1, ax2):  # below the axes: config names are long
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout(**({"rect": (0, 0, 1, 0.93)} if mark else {}))
    fig.savefig(path, dpi=100)
    plt.close(fig)
