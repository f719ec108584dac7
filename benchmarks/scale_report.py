"""The scale-out results of benchmarks/gpu_tp.sh as markdown: the sweep's wall time on one GPU against two,
each job's headline numbers, and the TP=2 run of the 70B shape. Reads only what the runs left under OUT.

    python benchmarks/scale_report.py OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = [("TTFT p50 ms", "perf/ttft_ms_p50"), ("TTFT p99 ms", "perf/ttft_ms_p99"), ("TPOT p50 ms", "perf/tpot_ms_p50"),
        ("TPOT p99 ms", "perf/tpot_ms_p99"), ("E2E p99 ms", "perf/e2e_ms_p99"), ("out tok/s", "perf/throughput_out_tok_s"),
        ("ok/failed", None), ("lateness p99 ms", "perf/lateness_ms_p99"), ("peak mem GiB", "perf/peak_mem_gb")]


def fmt(v) -> str:
    return "-" if v is None else f"{v:,.4g}" if isinstance(v, float) else str(v)


def row(label: str, summary: dict) -> str:
    m = summary.get("metrics", {})
    cells = [f"{fmt(m.get('perf/requests_ok'))}/{fmt(m.get('perf/requests_failed'))}" if k is None else fmt(m.get(k))
             for _, k in KEYS]
    return f"| {label} | " + " | ".join(cells) + " |"


def summaries(d: Path) -> list[tuple[str, dict]]:
    out = []
    for f in sorted(d.glob("**/summary.json")):
        s = json.loads(f.read_text())
        snap = f.with_name("config_snapshot.json")
        gpu = json.loads(snap.read_text())["environment"].get("cuda_visible_devices") if snap.exists() else None
        out.append((f"{f.parent.name}: {'+'.join(s.get('opts') or []) or 'baseline'} (GPU {gpu})", s))
    return out


def main(out: Path) -> None:
    times = {}
    if (out / "times.tsv").exists():
        for line in (out / "times.tsv").read_text().splitlines():
            name, secs, rc = line.split("\t")
            times[name] = (int(secs), int(rc))
    print("# Scale-out on the 2-GPU H200 machine (benchmarks/gpu_tp.sh)\n")
    for f in ("nvidia_smi.txt", "versions.txt"):
        if (out / f).exists():
            print("```\n" + (out / f).read_text().strip() + "\n```\n")
    print("| step | wall s | exit |\n|---|---|---|")
    for name, (secs, rc) in times.items():
        print(f"| {name} | {secs} | {rc} |")
    if "sweep_local_1gpu" in times and "sweep_ray_2gpu" in times:
        a, b = times["sweep_local_1gpu"][0], times["sweep_ray_2gpu"][0]
        print(f"\nThe 2-job sweep: {a} s one after the other on one GPU, {b} s on two GPUs at once "
              f"(Ray): {a / max(b, 1):.2f}x.\n")
    head = "| run | " + " | ".join(k for k, _ in KEYS) + " |\n|---|" + "---|" * len(KEYS)
    for title, sub in (("Sweep, one GPU (local launcher)", "sweep_local"), ("Sweep, two GPUs (Ray)", "sweep_ray"),
                       ("Llama-3-70B shape, vLLM TP=2", "tp2_70b"), ("TP=2, eager, no custom all-reduce", "tp2_70b_eager")):
        rows = summaries(out / sub) if (out / sub).exists() else []
        if rows:
            print(f"\n## {title}\n\n{head}")
            for label, s in rows:
                print(row(label, s))
    refused = out / "tp_refused_on_1gpu.log"
    if refused.exists():
        lines = [ln for ln in refused.read_text().splitlines() if "tensor_parallel_size" in ln]
        print("\nTP=2 with one visible GPU: " + (lines[-1].strip() if lines else "(no refusal found in the log)"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
