"""What the HTTP path adds, at a few hundred open streams: the same workload replayed by the in-process driver
and over HTTP (the locust driver, in its own process) against the stdlib server (optladder/serving/server.py) and an
ASGI one (benchmarks/asgi_server.py: Starlette under uvicorn, as vLLM runs), side by side in one run.

    .venv/bin/python benchmarks/http_overhead.py --out benchmarks/results/http_overhead

One warm engine (the tiny random model, continuous batching, paged KV) serves every replay; the modes take
turns round after round (in-process, ASGI, stdlib, then again...), so a drift of the machine falls on all of
them alike. Scenarios: a closed loop with 300 requests in flight, and an open-loop burst of 300 requests
sent at once. Reported per mode: TTFT p50/p99, E2E p99, lateness p99 (sent minus due: the client's own
delay), throughput, and what each HTTP server adds to TTFT p99 and lateness p99 over the in-process
replay of the same round (the median over rounds).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import asgi_server  # noqa: E402
from optladder.engine.config import EngineConfig, ModelConfig  # noqa: E402
from optladder.engine.llm_engine import LLMEngine  # noqa: E402
from optladder.engine.sequence import SamplingParams  # noqa: E402
from optladder.serving import server as stdlib_server  # noqa: E402
from optladder.traffic.http_driver import replay_http  # noqa: E402
from optladder.traffic.metrics import compute_metrics  # noqa: E402
from optladder.traffic.replay import InProcessDriver  # noqa: E402
from optladder.traffic.replay_config import Pacing, ReplayConfig  # noqa: E402
from optladder.traffic.request import Request  # noqa: E402

TINY = ModelConfig(name="tiny", source="random", package=None, gguf_file=None, tokenizer="smollm2",
                   hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=16384, init_std=0.3)
MODES = ("in-process", "asgi", "stdlib")
KEYS = ("perf/ttft_ms_p50", "perf/ttft_ms_p99", "perf/e2e_ms_p99", "perf/lateness_ms_p99", "perf/throughput_req_s")
# the time in the table is wall-clock on a shared machine; CPU time per token of this process (engine plus
# driver or server, the client excluded) is what each server costs whatever the neighbours do


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=300)
    ap.add_argument("--requests", type=int, default=900, help="per closed-loop replay")
    ap.add_argument("--burst", type=int, default=300, help="open loop: requests sent at once")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, help="PREFIX: writes PREFIX.md and PREFIX.json")
    return ap.parse_args()


def workload(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"r{i:04d}", [rng.randrange(300, 40000) for _ in range(rng.randrange(16, 65))],
                    rng.randrange(16, 65)) for i in range(n)]


def replay(engine: LLMEngine, mode: str, reqs: list[Request], closed: bool, concurrency: int) -> dict:
    params = (lambda r: SamplingParams(max_tokens=r.output_len, ignore_eos=True))
    cpu0, wall0 = time.process_time(), time.monotonic()  # this process: engine and driver or server, not the client
    cfg = ReplayConfig(progress=False, request_timeout_s=600)
    pacing = Pacing("closed" if closed else "open", concurrency)
    if mode == "in-process":
        records = InProcessDriver(engine, params).replay(reqs, cfg, pacing)
    else:
        serve = asgi_server.serve if mode == "asgi" else stdlib_server.serve
        with serve(engine, "127.0.0.1", 0, model_name="tiny") as handle:
            records = replay_http(reqs, handle.url, "tiny", cfg, pacing)
    cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
    m = compute_metrics(records)
    assert engine.block_manager.all_free(), f"{mode}: KV blocks left allocated after the replay"
    tokens = sum(r.output_tokens for r in records if r.ok)
    return {**{k: m.get(k) for k in (*KEYS, "perf/requests_ok", "perf/requests_failed")},
            "cpu_us_per_token": 1e6 * cpu_s / max(tokens, 1), "cores_used": cpu_s / wall_s}


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    engine = LLMEngine(TINY, EngineConfig(device="cpu", max_model_len=256, kv_cache_gb=0.5, paged_kv=True,
                                          dynamic_batching=True, batched_decode=True,
                                          max_num_seqs=args.max_num_seqs))
    engine.generate([[5] * 32] * 8, SamplingParams(max_tokens=8))  # warm-up
    scenarios = {"closed, 300 in flight": (workload(args.requests, 1), True),
                 "open, burst of 300": (workload(args.burst, 2), False)}
    if args.concurrency != 300 or args.burst != 300:
        scenarios = {f"closed, {args.concurrency} in flight": scenarios.pop("closed, 300 in flight"),
                     f"open, burst of {args.burst}": scenarios.pop("open, burst of 300")}
    results: dict[str, dict[str, list[dict]]] = {s: {m: [] for m in MODES} for s in scenarios}
    t0 = time.time()
    for rnd in range(args.rounds):
        for name, (reqs, closed) in scenarios.items():
            for mode in MODES:
                r = replay(engine, mode, reqs, closed, args.concurrency)
                r["load_avg_1m"] = os.getloadavg()[0]
                results[name][mode].append(r)
                print(f"round {rnd} {name:>24} {mode:>10}: TTFT p99 {r['perf/ttft_ms_p99']:8.0f} ms, lateness "
                      f"p99 {r['perf/lateness_ms_p99']:7.1f} ms, {r['perf/throughput_req_s']:.1f} req/s, "
                      f"{r['cpu_us_per_token']:.0f} CPU µs/token, ok {r['perf/requests_ok']:.0f}", flush=True)
    report = render(results, args, time.time() - t0)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(report)
        args.out.with_suffix(".json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                             "results": results}, indent=2))
    return 0


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def added(results: dict[str, list[dict]], mode: str, key: str) -> float:
    """Median over rounds of (this mode - in-process, the same round)."""
    return statistics.median(h[key] - p[key] for h, p in zip(results[mode], results["in-process"]))


def render(results: dict, args, seconds: float) -> str:
    import uvicorn
    import starlette

    lines = [f"# What the HTTP path adds ({args.rounds} rounds, modes alternating)", "",
             f"`.venv/bin/python benchmarks/http_overhead.py --out benchmarks/results/http_overhead`: tiny random "
             f"model, continuous batching (max_num_seqs={args.max_num_seqs}), paged KV; prompts 16-64 token ids, "
             f"outputs 16-64 tokens (ignore_eos); {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, torch {torch.__version__} ({args.threads} thread), Python "
             f"{platform.python_version()}, uvicorn {uvicorn.__version__}, starlette {starlette.__version__}; "
             f"{seconds / 60:.1f} min. Medians over rounds; the client is locust in its own process.", ""]
    for name, by_mode in results.items():
        lines += [f"## {name}", "", "| mode | TTFT p50 ms | TTFT p99 ms | E2E p99 ms | lateness p99 ms | req/s | "
                  "CPU µs per token | cores used | TTFT p99 added ms | lateness p99 added ms | CPU µs per token added | "
                  "failed |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for mode in MODES:
            runs = by_mode[mode]
            extra = ("-", "-", "-") if mode == "in-process" else (
                f"{added(by_mode, mode, 'perf/ttft_ms_p99'):+,.0f}", f"{added(by_mode, mode, 'perf/lateness_ms_p99'):+,.1f}",
                f"{added(by_mode, mode, 'cpu_us_per_token'):+,.0f}")
            lines.append(f"| {mode} | {med(runs, 'perf/ttft_ms_p50'):,.0f} | {med(runs, 'perf/ttft_ms_p99'):,.0f} | "
                         f"{med(runs, 'perf/e2e_ms_p99'):,.0f} | {med(runs, 'perf/lateness_ms_p99'):,.1f} | "
                         f"{med(runs, 'perf/throughput_req_s'):.1f} | {med(runs, 'cpu_us_per_token'):,.0f} | "
                         f"{med(runs, 'cores_used'):.2f} | "
                         f"{extra[0]} | {extra[1]} | {extra[2]} | "
                         f"{sum(r['perf/requests_failed'] for r in runs):.0f} |")
        loads = [r["load_avg_1m"] for m in MODES for r in by_mode[m]]
        lines += ["", f"Machine load average (1 min) over these replays: {min(loads):.1f} to {max(loads):.1f}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
