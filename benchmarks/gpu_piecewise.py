"""piecewise_graphs on the H200: the steps with prompt tokens replayed piecewise against the same steps run
eagerly, on one engine in one process (the pieces switched off and on between runs: the same weights, the
same machine), under the Azure trace replay of benchmarks/gpu_serving_vs_vllm.py (its protocol: Llama-3-8B's
shape with a 49,152-token vocabulary, random bf16 weights, the first 500 requests, inputs clipped to 4,096
tokens, the recorded output lengths, EOS ignored) at time scales 4 and 8 (--modes: the order of the runs),
and the 64 x 1,000 -> 128 burst (all prefill up front). The engine: gpu_serving_vs_vllm.py's switches (paged_kv,
flash_attn, dynamic_batching, batched_decode, cuda_graphs, fused_kernels, skinny_gemm, chunked_prefill) plus
piecewise_graphs. First the CUDA checks of tests/test_piecewise.py (the pieces captured: logits, tokens and KV
against the eager forward); then (--micro) single mixed steps by shape (running decodes x prompt tokens), each
timed four ways, interleaved: eager with the plain layer, eager with the fused kernels (what fused_kernels runs
without piecewise_graphs), plain pieces, fused pieces (what the engine runs with both); and a torch profiler
table of one shape for the eager fused step and each kind of pieces.

    python3 benchmarks/gpu_piecewise.py --requests .stage/azure500.json --out $OUT     (one device call, ~6 min)

Results: $OUT/gpu_piecewise.json and gpu_piecewise.md (written after every run: a cut call keeps what ran).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_serving_vs_vllm as sv  # noqa: E402

KEYS = ("out_tok_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "e2e_ms_p99")


def report(res: dict) -> str:
    lines = ["# piecewise_graphs on the H200: prompt steps piecewise vs eager, one engine, one run", "",
             "- command: `python3 benchmarks/gpu_piecewise.py --requests .stage/azure500.json --out $OUT`",
             f"- GPU: {res.get('gpu')}; torch {res.get('torch')}; engine start {res.get('init_s')} s "
             f"(piecewise capture {res.get('piecewise_capture_s')} s, {res.get('piecewise_graphs')} graphs)",
             f"- switches: {', '.join(res.get('opts', []))}; 'off' runs the same engine with its pieces unset",
             f"- CUDA checks (tests/test_piecewise.py): {res.get('tests', '-')}", ""]
    lines += ["| run | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | E2E p99 s | mixed steps: n, ms p50 | "
              "decode steps: n, ms p50 | piecewise steps, eager fallbacks |", "|---|---|---|---|---|---|---|---|"]
    for r in res.get("runs", []):
        m, st = r["replay"], r["replay"]["steps"]
        lines.append(f"| {r['scale']}x, {r['mode']} | {m['out_tok_s']:,.0f} | {m['ttft_ms_p50']:.0f} / {m['ttft_ms_p99']:.0f} | "
                     f"{m['tpot_ms_p50']:.1f} / {m['tpot_ms_p99']:.1f} | {m['e2e_ms_p99'] / 1e3:.1f} | "
                     f"{st['mixed']['n']}, {st['mixed']['ms_p50'] or 0:.1f} | {st['decode']['n']}, "
                     f"{st['decode']['ms_p50'] or 0:.2f} | {r['piecewise_steps']}, {r['piecewise_fallbacks']} |")
    lines += ["", "on / off, medians of the repeats:", "", "| scale | " + " | ".join(KEYS) + " |",
              "|---|" + "---|" * len(KEYS)]
    for scale in sorted({r["scale"] for r in res.get("runs", [])}):
        med = {mode: {k: statistics.median(r["replay"][k] for r in res["runs"] if r["scale"] == scale and r["mode"] == mode)
                      for k in KEYS} for mode in ("off", "on")
               if any(r["scale"] == scale and r["mode"] == mode for r in res["runs"])}
        if len(med) == 2:
            lines.append(f"| {scale}x | " + " | ".join(f"{med['on'][k] / med['off'][k]:.2f}x" for k in KEYS) + " |")
    if "micro" in res:
        ways = ("eager plain", "eager fused", "pieces plain", "pieces fused")
        lines += ["", "One mixed step (ms, median of 5): running decodes x prompt tokens", "",
                  "| shape | " + " | ".join(ways) + " | fused pieces / eager fused |", "|---|" + "---|" * 5]
        for shape, m in res["micro"]["shapes"].items():
            lines.append(f"| {shape} | " + " | ".join(f"{m[w]:.2f}" for w in ways)
                         + f" | {m['pieces fused'] / m['eager fused']:.2f}x |")
    if "burst" in res:
        b = res["burst"]
        lines += ["", "64 x 1,000 -> 128 burst, output tok/s: " +
                  ", ".join(f"{mode} {v:,.0f}" for mode, v in b.items())]
    return "\n".join(lines) + "\n"


def micro(engine, pieces, shapes: list[str], profile_shape: str, out: Path) -> dict:
    """One mixed step at a time: `d` decodes running, then a fresh prompt of `p` tokens joins the next step
    (timed, synchronized), then it is aborted; the four ways interleaved, 5 each, medians in ms."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from optladder.engine.model import DecodeKernels
    from optladder.engine.piecewise import PiecewiseGraphRunner
    from optladder.engine.sequence import SamplingParams

    runner = engine.runner
    fused_kernels = runner.kernels
    plain = PiecewiseGraphRunner(engine.model, engine.device, pieces.buckets[-1], pieces.dummy_slot)
    sync = torch.cuda.synchronize
    ways = {"eager plain": (None, DecodeKernels()), "eager fused": (None, fused_kernels),
            "pieces plain": (plain, fused_kernels), "pieces fused": (pieces, fused_kernels)}
    res = {"plain_capture_s": round(plain.capture_s, 2), "shapes": {}}
    uid = iter(range(10 ** 6))

    def one(way: str, p: int) -> float:
        runner.piecewise, runner.kernels = ways[way]
        rid = f"m{next(uid)}"
        engine.add_request(rid, sv.prompts(7000 + int(rid[1:]), 1, p)[0], SamplingParams(max_tokens=8, ignore_eos=True))
        sync()
        t = time.perf_counter()
        engine.step()
        sync()
        el = time.perf_counter() - t
        engine.abort_request(rid)
        return el * 1e3

    running: list[str] = []
    for shape in shapes:
        d, p = map(int, shape.split("x"))
        while len(running) < d:  # the decodes: long enough to outlast the shapes
            rid = f"d{len(running)}"
            engine.add_request(rid, sv.prompts(5000 + len(running), 1, 256)[0],
                               SamplingParams(max_tokens=engine.cfg.max_model_len - 256, ignore_eos=True))
            running.append(rid)
        while len(running) > d:
            engine.abort_request(running.pop())
        runner.piecewise, runner.kernels = pieces, fused_kernels
        while any(s.num_computed_tokens < len(s) - 1 for s in engine.scheduler.running):  # prompts in
            engine.step()
        times = {w: [] for w in ways}
        for _ in range(6):
            for w in ways:
                times[w].append(one(w, p))
        res["shapes"][shape] = {w: round(statistics.median(ts[1:]), 2) for w, ts in times.items()}  # first: warm-up
        print(shape, res["shapes"][shape], flush=True)
        if shape == profile_shape:
            tables = []
            for w in ("eager fused", "pieces plain", "pieces fused"):
                one(w, p)
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    ms = [one(w, p) for _ in range(3)]
                tables.append(f"## {w}: 3 steps of {d} decodes + {p} prompt tokens, {ms} ms\n"
                              + prof.key_averages().table(sort_by="device_time_total", row_limit=25))
            (out / "profile_piecewise.txt").write_text("\n\n".join(tables))
    for rid in running:
        engine.abort_request(rid)
    runner.piecewise, runner.kernels = pieces, fused_kernels
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("gpu_out"))
    ap.add_argument("--scales", default="4,8")
    ap.add_argument("--modes", default="off,on", help="the order of the runs at each scale")
    ap.add_argument("--deadline", type=float, default=420, help="seconds from the start: no run starts after")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--micro", default="8x16,8x100,8x500,8x1500,64x16,64x100,64x500,250x16,250x100,250x500",
                    help="mixed-step shapes, running decodes x prompt tokens ('' for none)")
    ap.add_argument("--profile-shape", default="250x100")
    args = ap.parse_args()
    start = time.monotonic()
    modes = args.modes.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict = {}

    def save():
        (args.out / "gpu_piecewise.json").write_text(json.dumps(res, indent=1, default=str))
        (args.out / "gpu_piecewise.md").write_text(report(res))

    if not args.skip_tests:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider",
                            "tests/test_piecewise.py"], cwd=ROOT, capture_output=True, text=True, timeout=240)
        res["tests"] = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
        (args.out / "test_piecewise.txt").write_text(p.stdout + p.stderr)
        save()
    import torch

    cuda = not sv.TINY  # GPU_SERVING_TINY=1: a 2-layer shape on the CPU, no pieces: checks this script's logic
    reqs = sv.load_requests(args.requests)
    engine, init_s = sv.our_engine(chunked=True, piecewise=True)
    pieces = engine.runner.piecewise
    if pieces is None:
        from optladder.engine.piecewise import PiecewiseGraphRunner

        assert not cuda
        pieces = PiecewiseGraphRunner(engine.model, engine.device, 64, 0, capture=False)  # never attached
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    import triton

    res.update(argv=sys.argv[1:], triton=triton.__version__, python=sys.version.split()[0])
    res.update(gpu=torch.cuda.get_device_name(0) if cuda else "cpu (tiny)", torch=torch.__version__,
               init_s=round(init_s, 1), opts=engine.enabled_opts, piecewise_capture_s=round(pieces.capture_s, 1),
               piecewise_graphs=sum(map(len, pieces.graphs.values())), runs=[])
    save()
    from optladder.engine.sequence import SamplingParams

    def generate(ps, n):
        seqs = engine.generate(ps, SamplingParams(max_tokens=n, ignore_eos=True))
        sync()
        return [s.num_output_tokens for s in seqs]

    def attach(mode):
        engine.runner.piecewise = (pieces if mode == "on" else None) if cuda else None

    generate(sv.prompts(99, 4, 512), 16)  # warm-up, pieces on
    if args.micro and cuda:  # on the CPU the pool has no dummy block for padding rows: pieces never attach there
        res["micro"] = micro(engine, pieces, args.micro.split(","), args.profile_shape, args.out)
        save()
    res["burst"] = {}
    n, plen, out = sv.BURSTS["burst_64x1000_128"]
    for mode in ("off", "on", "off", "on"):
        attach(mode)
        t = time.perf_counter()
        got = generate(sv.prompts(10, n, plen), out)
        el = time.perf_counter() - t
        assert got == [out] * n
        res["burst"][f"{mode} {len(res['burst']) // 2 + 1}"] = round(n * out / el, 1)
    save()
    for scale in map(float, args.scales.split(",")):
        for mode in modes:
            if time.monotonic() - start > args.deadline:
                res.setdefault("skipped", []).append(f"{scale}x {mode}: past --deadline")
                continue
            attach(mode)
            s0, f0 = pieces.replays, pieces.eager_fallbacks
            rep = sv.replay_ours(engine, reqs, scale)
            res["runs"].append({"scale": int(scale) if scale == int(scale) else scale, "mode": mode, "replay": rep,
                                "piecewise_steps": pieces.replays - s0, "piecewise_fallbacks": pieces.eager_fallbacks - f0})
            save()
            print(f"{scale}x {mode}: {json.dumps({k: rep[k] for k in KEYS})}", flush=True)
    if cuda:
        res["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    save()
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
