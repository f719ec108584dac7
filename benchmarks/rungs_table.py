"""A table of the rungs a ladder left on disk, finished or not: for a ladder cut short before it wrote ladder.md
(a device call's deadline), from each rung directory's summary.json (and teacher_forced.json where its gate
ran teacher-forced).

    python benchmarks/rungs_table.py DIR [DIR ...]   # DIR: a ladder run directory holding rung*-r0/
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

COLS = (("records ok", "perf/requests_ok", "{:.0f}"), ("out tok/s", "perf/throughput_out_tok_s", "{:,.0f}"),
        ("TTFT p50 / p99 ms", ("perf/ttft_ms_p50", "perf/ttft_ms_p99"), "{:,.0f}"),
        ("TPOT p50 / p99 ms", ("perf/tpot_ms_p50", "perf/tpot_ms_p99"), "{:.1f}"),
        ("E2E p50 / p99 s", ("perf/e2e_ms_p50", "perf/e2e_ms_p99"), "{:.1f}", 1e-3),
        ("lateness p99 ms", "perf/lateness_ms_p99", "{:.2f}"), ("peak GiB", "perf/peak_mem_gb", "{:.1f}"),
        ("KV reserved / used GiB", ("perf/kv_reserved_gb", "perf/kv_used_gb"), "{:.2f}"))
TF = (("KL mean", "quality/kl_vs_control_mean", "{:.4f}"), ("top-1", "quality/top1_agree_vs_control", "{:.2%}"))


def cell(m: dict, key, fmt: str, scale: float = 1.0) -> str:
    keys = key if isinstance(key, tuple) else (key,)
    vals = [m.get(k) for k in keys]
    return " / ".join("-" if v is None else fmt.format(v * scale) for v in vals)


def rows(ladder_dir: Path) -> list[str]:
    out = []
    for d in sorted(ladder_dir.glob("rung*-r0"), key=lambda p: int(p.name[4:].split("-")[0])):
        s = d / "summary.json"
        if not s.is_file():
            err = d / "error.txt"
            last = err.read_text().strip().splitlines()[-1][:80] if err.is_file() else ""
            # a rung stopped by a signal (a deadline, STOP_AFTER, ctrl-C) was cut short, not refused
            why = (("stopped: " if any(w in last for w in ("Terminated", "KeyboardInterrupt")) else "failed: ")
                   + last if last else "did not finish")
            out.append(f"| {d.name} | {why} | " + " | ".join("-" for _ in (COLS + TF)[1:]) + " |")
            continue
        m = json.loads(s.read_text())["metrics"]
        tf = d / "teacher_forced.json"
        m = {**m, **(json.loads(tf.read_text())["metrics"] if tf.is_file() else {})}
        out.append(f"| {d.name} | " + " | ".join(cell(m, c[1], c[2], *c[3:]) for c in COLS + TF) + " |")
    return out


if __name__ == "__main__":
    print("| rung | " + " | ".join(c[0] for c in COLS + TF) + " |")
    print("|---" * (1 + len(COLS) + len(TF)) + "|")
    for arg in sys.argv[1:]:
        print("\n".join(rows(Path(arg))))
