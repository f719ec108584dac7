"""benchmarks/http_overhead.py --combine: one report from several device calls' rounds, each mode's ratio over
the in-process replay taken within its own round (a round pairs with itself, whatever order the files come in)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("perf/ttft_ms_p50", "perf/ttft_ms_p99", "perf/tpot_ms_p50", "perf/tpot_ms_p99", "perf/e2e_ms_p50",
        "perf/e2e_ms_p99", "perf/lateness_ms_p99", "perf/throughput_req_s", "perf/throughput_out_tok_s")


def part(path: Path, rnd: int, in_process_tpot: float, stdlib_tpot: float, fast_tpot: float | None = None) -> Path:
    def run(tpot: float) -> dict:
        return {**{k: 1.0 for k in KEYS}, "perf/tpot_ms_p50": tpot, "perf/requests_ok": 10.0,
                "perf/requests_failed": 0.0, "cpu_us_per_token": 100.0, "round": rnd}

    path.write_text(json.dumps({
        "args": {"gpu": "True", "threads": "1", "max_num_seqs": "256", "trace_requests": "10"},
        "env": {"gpu": "test card", "opts": ["paged_kv"]}, "seconds": 60.0,
        "results": {"open, Azure head 10 at 1x": {
            "in-process": [run(in_process_tpot)], "stdlib": [run(stdlib_tpot)],
            **({"stdlib-0.5ms": [run(fast_tpot)]} if fast_tpot is not None else {})}}}))
    return path


def combined_row(tmp_path, files, mode: str) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "http_overhead.py"), "--combine",
                          *map(str, files), "--out", str(tmp_path / "all")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return next(line for line in (tmp_path / "all.md").read_text().splitlines() if line.startswith(f"| {mode} |"))


def test_combine_pairs_each_round_with_itself(tmp_path):
    # round 0: 10 -> 12 (1.2x); round 1: 20 -> 30 (1.5x); the median of the two is 1.35x. Paired across rounds
    # (files in the order given, rounds not matched) it would be (30/10 + 12/20) / 2 = 1.80x.
    r1 = part(tmp_path / "r1.json", 1, 20.0, 30.0)
    r0 = part(tmp_path / "r0.json", 0, 10.0, 12.0)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "http_overhead.py"), "--combine", str(r1), str(r0),
                          "--out", str(tmp_path / "all")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "all.md").read_text()
    assert "(2 rounds, modes alternating)" in md
    stdlib = next(line for line in md.splitlines() if line.startswith("| stdlib |"))
    assert "| 1.35 |" in stdlib, stdlib
    combined = json.loads((tmp_path / "all.json").read_text())["results"]["open, Azure head 10 at 1x"]
    assert [r["round"] for r in combined["stdlib"]] == [0, 1]


def test_a_mode_missing_from_one_round_pairs_with_its_own_round(tmp_path):
    # round 0 (an older file) has no stdlib-0.5ms; round 1 has it at 22 against in process 20: 1.10x. Paired by
    # place in the list, its one run would meet round 0's in-process 10: 2.20x.
    r0 = part(tmp_path / "r0.json", 0, 10.0, 12.0)
    r1 = part(tmp_path / "r1.json", 1, 20.0, 30.0, fast_tpot=22.0)
    assert "| 1.10 |" in combined_row(tmp_path, [r0, r1], "stdlib-0.5ms")
