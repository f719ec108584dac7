"""What the HTTP path adds, at a few hundred open streams: the same workload replayed by the in-process driver
and over HTTP (the locust driver, in its own process) against the stdlib server (optladder/serving/server.py) and an
ASGI one (benchmarks/asgi_server.py: Starlette under uvicorn, as vLLM runs), side by side in one run.

    .venv/bin/python benchmarks/http_overhead.py --out benchmarks/results/http_overhead
    python3 benchmarks/http_overhead.py --gpu --trace .stage/azure500.json --round 0 --out $OUT/serving_path
        (on a GPU: benchmarks/gpu_serving_path.sh; one round a call, --combine the rounds' JSON files)

--gpu: Llama-3-8B's shape with random bf16 weights and every GPU switch on, the settings of
benchmarks/gpu_serving_vs_vllm.py (60 GiB KV, 256 sequences, 8,192 batched tokens), on CUDA; the scenarios are the
Azure trace's head (--trace: gpu_serving_vs_vllm.py --make-requests' file, --trace-requests of it) replayed open
loop at its own timestamps divided by each of --scales: the replay `python run.py +ab=engine_vllm` made over HTTP,
here with the same engine in process and behind each server, so that what the serving path adds is measured apart.

One warm engine (the tiny random model, continuous batching, paged KV) serves every replay; the modes take
turns, each round opening with the next mode (in-process, ASGI, stdlib; then ASGI, stdlib, in-process; ...), so a
drift of the machine falls on all of them alike. Scenarios: a closed loop with 300 requests in flight, and an
open-loop burst of 300 requests sent at once. Reported per mode: TTFT p50/p99, E2E p99, lateness p99 (sent minus due: the client's own
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
# --gpu also serves with the stdlib server under a 0.5 ms GIL switch interval (Python's default: 5 ms): a handler
# thread per stream wakes for every token, and the engine's thread waits for the GIL behind them
GPU_MODES = ("in-process", "stdlib", "asgi", "stdlib-0.5ms")
KEYS = ("perf/ttft_ms_p50", "perf/ttft_ms_p99", "perf/tpot_ms_p50", "perf/tpot_ms_p99", "perf/e2e_ms_p50",
        "perf/e2e_ms_p99", "perf/lateness_ms_p99", "perf/throughput_req_s", "perf/throughput_out_tok_s")
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
    ap.add_argument("--gpu", action="store_true", help="the 8B shape on CUDA over --trace (see the docstring)")
    ap.add_argument("--trace", type=Path, help="--gpu: the trace head (gpu_serving_vs_vllm.py --make-requests)")
    ap.add_argument("--trace-requests", type=int, default=300, help="--gpu: the first N requests of --trace")
    ap.add_argument("--scales", default="1,4", help="--gpu: the trace's rate multiplied by each (comma list)")
    ap.add_argument("--round", type=int, help="--gpu: run only this round (the modes start at a rotated place)")
    ap.add_argument("--combine", type=Path, nargs="+", help="the rounds' JSON files: one report of them all")
    args = ap.parse_args()
    if args.gpu and args.trace is None and not args.combine:
        ap.error("--gpu needs --trace FILE (python3 benchmarks/gpu_serving_vs_vllm.py --make-requests CSV "
                 "--requests FILE)")
    if args.gpu and not args.combine and args.trace is not None and not args.trace.is_file():
        ap.error(f"--trace {args.trace}: no such file")
    if not args.gpu and not args.combine:
        given = [f for f, v in (("--trace", args.trace), ("--round", args.round)) if v is not None]
        if given:
            ap.error(f"{', '.join(given)}: only with --gpu (the GPU mode's trace replay)")
    if args.round is not None and args.round < 0:
        ap.error(f"--round {args.round}: a round number is 0 or more")
    try:
        args.scale_list = [float(x) for x in args.scales.split(",")]
    except ValueError:
        ap.error(f"--scales {args.scales!r}: a comma list of positive numbers, e.g. 1,4")
    if any(x <= 0 for x in args.scale_list) or len(set(args.scale_list)) != len(args.scale_list):
        ap.error(f"--scales {args.scales!r}: each scale positive and given once, e.g. 1,4")
    return args


def workload(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"r{i:04d}", [rng.randrange(300, 40000) for _ in range(rng.randrange(16, 65))],
                    rng.randrange(16, 65)) for i in range(n)]


def trace_workload(path: Path, n: int, scale: float, vocab: int, clip: int) -> list[Request]:
    """The trace head's first n rows as requests at their own times / scale, token ids seeded per request
    (the same ids gpu_serving_vs_vllm.py sends)."""
    rows = json.loads(path.read_text())[:n]
    out = []
    for k, (t, n_in, n_out) in enumerate(rows):
        rng = random.Random(k)
        out.append(Request(f"r{k}", [rng.randrange(10, vocab) for _ in range(max(1, min(n_in, clip)))], max(1, n_out),
                           scheduled_at=t / scale))
    return out


def gpu_engine():
    """The 8B shape with every GPU switch on, as benchmarks/gpu_serving_vs_vllm.py builds it; warmed up."""
    import gpu_serving_vs_vllm as g

    engine, load_s = g.our_engine(chunked=True)
    engine.generate(g.prompts(99, 4, 512), SamplingParams(max_tokens=16, ignore_eos=True))
    engine.reset_stats()
    return engine, g.SHAPE["vocab_size"], g.INPUT_CLIP, load_s


def replay(engine: LLMEngine, mode: str, reqs: list[Request], closed: bool, concurrency: int) -> dict:
    params = (lambda r: SamplingParams(max_tokens=r.output_len, ignore_eos=True))
    cpu0, wall0 = time.process_time(), time.monotonic()  # this process: engine and driver or server, not the client
    cfg = ReplayConfig(progress=False, request_timeout_s=600)
    pacing = Pacing("closed" if closed else "open", concurrency)
    if mode == "in-process":
        records = InProcessDriver(engine, params).replay(reqs, cfg, pacing)
    else:
        serve = asgi_server.serve if mode == "asgi" else stdlib_server.serve
        switch = sys.getswitchinterval()
        if mode == "stdlib-0.5ms":
            sys.setswitchinterval(0.0005)
        try:
            with serve(engine, "127.0.0.1", 0, model_name="tiny") as handle:
                records = replay_http(reqs, handle.url, "tiny", cfg, pacing)
        finally:
            sys.setswitchinterval(switch)
    cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
    m = compute_metrics(records)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    assert engine.block_manager.all_free(), f"{mode}: KV blocks left allocated after the replay"
    tokens = sum(r.output_tokens for r in records if r.ok)
    return {**{k: m.get(k) for k in (*KEYS, "perf/requests_ok", "perf/requests_failed")},
            "cpu_us_per_token": 1e6 * cpu_s / max(tokens, 1), "cores_used": cpu_s / wall_s}


def main() -> int:
    args = parse_args()
    if args.combine:
        return combine(args)
    if not args.gpu:  # the GPU engine's host work keeps torch's own thread count, as gpu_serving_vs_vllm.py does
        torch.set_num_threads(args.threads)
    t0 = time.time()
    env: dict = {}
    if args.gpu:
        engine, vocab, clip, load_s = gpu_engine()
        import starlette
        import uvicorn

        env = {"gpu": torch.cuda.get_device_name() if engine.device.type == "cuda" else "CPU (GPU_SERVING_TINY)",
               "engine_load_s": round(load_s, 1), "opts": sorted(engine.enabled_opts), "trace": str(args.trace),
               "input_clip": clip, "torch": torch.__version__, "python": platform.python_version(),
               "uvicorn": uvicorn.__version__, "starlette": starlette.__version__}
        scenarios = {f"open, Azure head {args.trace_requests} at {s:g}x": (
            trace_workload(args.trace, args.trace_requests, s, vocab, clip), False) for s in args.scale_list}
    else:
        engine = LLMEngine(TINY, EngineConfig(device="cpu", max_model_len=256, kv_cache_gb=0.5, paged_kv=True,
                                              dynamic_batching=True, batched_decode=True,
                                              max_num_seqs=args.max_num_seqs))
        engine.generate([[5] * 32] * 8, SamplingParams(max_tokens=8))  # warm-up
        scenarios = {"closed, 300 in flight": (workload(args.requests, 1), True),
                     "open, burst of 300": (workload(args.burst, 2), False)}
        if args.concurrency != 300 or args.burst != 300:
            scenarios = {f"closed, {args.concurrency} in flight": scenarios.pop("closed, 300 in flight"),
                         f"open, burst of {args.burst}": scenarios.pop("open, burst of 300")}
    modes = GPU_MODES if args.gpu else MODES
    results: dict[str, dict[str, list[dict]]] = {s: {m: [] for m in modes} for s in scenarios}
    rounds = [args.round] if args.round is not None else range(args.rounds)
    if args.round is not None:
        args.rounds = 1
    for rnd in rounds:
        for name, (reqs, closed) in scenarios.items():
            for mode in modes[rnd % len(modes):] + modes[:rnd % len(modes)]:  # each round opens with another
                r = replay(engine, mode, reqs, closed, args.concurrency)
                r["load_avg_1m"] = os.getloadavg()[0]
                r["round"] = rnd
                results[name][mode].append(r)
                f = lambda k, spec: "-" if r.get(k) is None else format(r[k], spec)  # noqa: E731
                print(f"round {rnd} {name:>24} {mode:>10}: TTFT p99 {f('perf/ttft_ms_p99', '8.0f')} ms, TPOT p50 "
                      f"{f('perf/tpot_ms_p50', '6.2f')} ms, E2E p99 {f('perf/e2e_ms_p99', '8.0f')} ms, lateness "
                      f"p99 {f('perf/lateness_ms_p99', '7.1f')} ms, {f('perf/throughput_req_s', '.1f')} req/s, "
                      f"{r['cpu_us_per_token']:.0f} CPU µs/token, ok {r['perf/requests_ok']:.0f}", flush=True)
    report = render(results, args, time.time() - t0, env)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(report)
        args.out.with_suffix(".json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                             "env": env, "results": results,
                                                             "seconds": time.time() - t0}, indent=2))
    return 0


def combine(args) -> int:
    """One report of several calls' JSON files (one round each): their results joined scenario by mode."""
    parts = [json.loads(Path(f).read_text()) for f in args.combine]
    results: dict = {}
    for part in parts:
        for name, by_mode in part["results"].items():
            for mode, runs in by_mode.items():
                results.setdefault(name, {})
                results[name].setdefault(mode, []).extend(runs)
    for by_mode in results.values():  # rounds in order in the combined file (pairs() matches them by number)
        for runs in by_mode.values():
            runs.sort(key=lambda r: r.get("round", 0))
    a = parts[0]["args"]
    args.rounds = sum(len(next(iter(p["results"].values()))["in-process"]) for p in parts)
    args.gpu, args.threads, args.max_num_seqs = a.get("gpu") == "True", a.get("threads"), a.get("max_num_seqs")
    args.trace_requests = a.get("trace_requests")
    report = render(results, args, sum(p.get("seconds", 0) for p in parts), parts[0].get("env") or {})
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(report)
        args.out.with_suffix(".json").write_text(json.dumps({"parts": [str(f) for f in args.combine],
                                                             "env": parts[0].get("env"), "results": results},
                                                            indent=2))
    return 0


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def pairs(results: dict[str, list[dict]], mode: str) -> list[tuple[dict, dict]]:
    """(this mode's replay, the in-process one) of every round both ran, matched by round number (a run without
    one, from an older file, by its place in the list)."""
    def by_round(runs: list[dict]) -> dict[int, dict]:
        return {r.get("round", i): r for i, r in enumerate(runs)}
    mine, base = by_round(results[mode]), by_round(results["in-process"])
    return [(mine[k], base[k]) for k in sorted(mine.keys() & base.keys())]


def added(results: dict[str, list[dict]], mode: str, key: str) -> float:
    """Median over rounds of (this mode - in-process, the same round)."""
    return statistics.median(h[key] - p[key] for h, p in pairs(results, mode))


def ratio(results: dict[str, list[dict]], mode: str, key: str) -> float | None:
    """Median over rounds of (this mode / in-process, the same round); None where no round has both."""
    xs = [h[key] / p[key] for h, p in pairs(results, mode) if p[key]]
    return statistics.median(xs) if xs else None


def render(results: dict, args, seconds: float, env: dict | None = None) -> str:
    if getattr(args, "gpu", False):
        return render_gpu(results, args, seconds, env or {})
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


def render_gpu(results: dict, args, seconds: float, env: dict) -> str:
    n = args.rounds
    clip = env.get("input_clip")
    lines = [f"# What the serving path adds on the GPU ({n} round{'s' if n != 1 else ''}, modes alternating)", "",
             f"`python3 benchmarks/http_overhead.py --gpu --trace {env.get('trace', 'FILE')} --round R` (one round a "
             f"device call, then `--combine`): {env.get('gpu', 'GPU')}, Llama-3-8B's shape with random bf16 weights, "
             f"{', '.join(env.get('opts', []))}; the first {args.trace_requests} requests of the Azure conversation "
             f"trace (inputs clipped to {f'{clip:,}' if clip else '?'} tokens, the recorded output lengths, EOS "
             f"ignored) open loop at their own timestamps divided by the scale; torch {env.get('torch', '?')}, Python "
             f"{env.get('python', '?')}, uvicorn {env.get('uvicorn', '?')}, starlette {env.get('starlette', '?')} "
             f"(on the GPU machine); {seconds / 60:.1f} min of replays and loads. One warm engine serves every "
             f"replay; medians over rounds; the HTTP client is locust in its own process; 'x in-process' is the "
             f"median over rounds of the mode's value over the in-process replay's of the same round.", ""]
    for name, by_mode in results.items():
        lines += [f"## {name}", "",
                  "| mode | TTFT p50 / p99 ms | TPOT p50 / p99 ms | E2E p50 / p99 ms | out tok/s | lateness p99 ms | "
                  "CPU µs per token | TPOT p50 x in-process | E2E p99 x in-process | failed |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for mode, runs in by_mode.items():
            if not runs:
                continue
            def x(key: str) -> str:
                v = ratio(by_mode, mode, key)
                return "-" if v is None else f"{v:.2f}"
            rel = ("-", "-") if mode == "in-process" else (x("perf/tpot_ms_p50"), x("perf/e2e_ms_p99"))
            lines.append(
                f"| {mode} | {med(runs, 'perf/ttft_ms_p50'):,.0f} / {med(runs, 'perf/ttft_ms_p99'):,.0f} | "
                f"{med(runs, 'perf/tpot_ms_p50'):.2f} / {med(runs, 'perf/tpot_ms_p99'):.2f} | "
                f"{med(runs, 'perf/e2e_ms_p50'):,.0f} / {med(runs, 'perf/e2e_ms_p99'):,.0f} | "
                f"{med(runs, 'perf/throughput_out_tok_s'):,.0f} | {med(runs, 'perf/lateness_ms_p99'):,.1f} | "
                f"{med(runs, 'cpu_us_per_token'):,.0f} | {rel[0]} | {rel[1]} | "
                f"{sum(r['perf/requests_failed'] for r in runs):.0f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
