"""A ladder: the baseline, then one more opt per rung, each rung gated against the last accepted one.
A rung that fails is reported and left out of the rungs after it. Writes ladder.json, ladder.md (the
DESIGN.md table: baseline vs all on, and per rung) and ladder.png."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from abtest.gates import GateConfig  # noqa: E402
from abtest.lossless import arms_lossless  # noqa: E402
from abtest.orchestrate import Arm, compose_arm, gate_pair, run_arms, verdict_table  # noqa: E402
from experiments.tracking import Tracker  # noqa: E402

ROWS = (("TTFT p50 (ms)", "perf/ttft_ms_p50"), ("TPOT p50 (ms)", "perf/tpot_ms_p50"),
        ("E2E p99 (ms)", "perf/e2e_ms_p99"), ("throughput (out tok/s)", "perf/throughput_out_tok_s"),
        ("capacity at P99 ≤ SLO (concurrency)", "capacity/max_concurrency"),
        ("peak memory (GiB)", "perf/peak_mem_gb"), ("KV reserved (GiB)", "perf/kv_reserved_gb"),
        ("KV utilization", "perf/kv_util"))


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}")


def _change(a, b) -> str:
    return "-" if a in (None, 0) or b is None else f"{(b - a) / a:+.1%}"


def ladder_table(rungs: list[dict]) -> str:
    base, final = rungs[0], rungs[rungs[-1]["accepted_rung"]]
    head = f"| metric | baseline | all on ({'+'.join(final['opts']) or 'none'}) | change |"
    lines = [head, "|---|---|---|---|"]
    for label, key in ROWS:
        a, b = base["metrics"].get(key), final["metrics"].get(key)
        lines.append(f"| {label} | {_fmt(a)} | {_fmt(b)} | {_change(a, b)} |")
    lines.append(f"| BLEU / ROUGE-L Δ vs control (last accepted rung) | - | "
                 f"{_fmt(final['metrics'].get('quality/bleu_vs_control'))} / "
                 f"{_fmt(final['metrics'].get('quality/rougeL_vs_control'))} | - |")
    lines += ["", "| rung | opt added | verdict | TTFT p50 | TPOT p50 | E2E p99 | peak mem GiB | exact match vs prev |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rungs:
        m = r["metrics"]
        lines.append(f"| {r['rung']} | {r['opt'] or 'baseline'} | {r['status']} | {_fmt(m.get('perf/ttft_ms_p50'))} | "
                     f"{_fmt(m.get('perf/tpot_ms_p50'))} | {_fmt(m.get('perf/e2e_ms_p99'))} | "
                     f"{_fmt(m.get('perf/peak_mem_gb'))} | {_fmt(m.get('quality/exact_match_vs_control'))} |")
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


def run_ladder_rungs(cfg: DictConfig, run_dir: Path, base: list[str]) -> int:
    ladder = OmegaConf.to_object(cfg.ladder)
    gate = GateConfig.from_dict(OmegaConf.to_container(cfg.gate, resolve=True))
    parent = Tracker(OmegaConf.to_object(cfg.tracking), f"ladder:{ladder.name}",
                     {"optladder.kind": "ladder", "ladder": ladder.name})
    ok = False
    try:
        prev = Arm("rung0-baseline", list(base), compose_arm(base, []), [])
        run_arms([prev], ladder.repeats, run_dir, parent.run_id)
        rungs = [{"rung": 0, "opt": None, "opts": [], "status": "baseline", "accepted_rung": 0,
                  "metrics": prev.runs[0].metrics, "run_id": prev.runs[0].run_id}]
        accepted: list[str] = []
        accepted_rung = 0
        for i, opt in enumerate(ladder.rungs, 1):
            extra = [f"+opt=[{','.join([*accepted, opt])}]"]
            cand = Arm(f"rung{i}-{opt}", [*base, *extra], compose_arm(base, extra), [])
            run_arms([cand], ladder.repeats, run_dir, parent.run_id)
            lossless, _ = arms_lossless(prev.cfg, cand.cfg)
            verdict, cres = gate_pair(prev, cand, gate, lossless)
            print(f"rung {i} (+{opt}) vs rung {accepted_rung}:\n{verdict_table(verdict)}")
            keep = verdict.status == "pass" or (verdict.status == "inconclusive" and ladder.keep_inconclusive)
            if keep:
                accepted.append(opt)
                prev, accepted_rung = cand, i
            rungs.append({"rung": i, "opt": opt, "opts": [*accepted] if keep else [*accepted, opt],
                          "status": verdict.status, "kept": keep, "accepted_rung": accepted_rung,
                          "metrics": cres.metrics, "run_id": cand.runs[0].run_id, "verdict": verdict.to_dict()})
        table = ladder_table(rungs)
        (run_dir / "ladder.json").write_text(json.dumps({"ladder": ladder.name, "rungs": rungs,
                                                         "accepted": accepted}, indent=2, default=str))
        (run_dir / "ladder.md").write_text(table + "\n")
        ladder_chart(rungs, run_dir / "ladder.png")
        print(table)
        print(f"ladder.json, ladder.md, ladder.png in {run_dir}")
        ok = True
        return 0
    finally:
        parent.log_artifacts(run_dir)
        parent.end(ok)
