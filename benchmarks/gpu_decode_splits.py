"""The paged decode attention's split count against the batch, on the GPU, Llama-3-8B's attention shape (32 query
heads, 8 KV heads, head dim 128, bf16, blocks of 16 tokens, block tables as wide as max_model_len 8,192, as the
CUDA-graph path passes them). Contexts drawn from the Azure conversation trace's first 500 requests (prompt clipped
to 4,096 tokens plus a uniform part of its answer, as a decode step at 4x sees them). For each batch: the split
count the heuristic picks (optladder/engine/kernels/paged_decode.py, num_splits) and the time of one layer's call at each
split count, median of 50 calls (CUDA events), with the bandwidth the K/V reads reach; the outputs of every split
count checked equal to one split's. Why: at 4x on the H200 our decode-only steps of 17-32 rows took 9.3 ms (median)
against vLLM's 6.0 ms, and 7.8 ms at 33-48 rows: the graph bucket of 32 rows gets 1 split (256 programs >= 132 SMs)
while the bucket of 16 gets 3.

    python3 benchmarks/gpu_decode_splits.py --requests .stage/azure500.json --out $OUT
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from optladder.engine.kernels.paged_decode import _num_sms, num_splits, paged_decode_attention  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK, MAX_LEN = 32, 8, 128, 16, 8192
BATCHES = (8, 16, 17, 24, 32, 48, 64, 96, 128, 192)
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def contexts(path: Path, n: int, rng: random.Random) -> list[int]:
    rows = json.loads(path.read_text())  # [arrival s, prompt tokens, output tokens] (gpu_serving_vs_vllm.py)
    pairs = [(min(max(1, r[-2]), 4096), r[-1]) for r in rows]
    return [p + rng.randint(0, max(0, o - 1)) + 1 for p, o in (rng.choice(pairs) for _ in range(n))]


def timed(fn, n: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)  # µs
    return statistics.median(times)


def replayed(fn, n: int = 20, rounds: int = 7) -> float:
    """µs per call with the call captured in a CUDA graph (as the engine replays its decode steps), `n` replays
    back to back a round, median of the rounds: the GPU's time, without the host's launches."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / n)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    rng = random.Random(0)
    sms = _num_sms(dev.index or 0)
    rows = []
    for batch in BATCHES:
        ctx = contexts(args.requests, batch, rng)
        blocks_per = [(c + BLOCK - 1) // BLOCK for c in ctx]
        total = sum(blocks_per) + 1
        k = torch.randn(total, BLOCK, KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        perm = torch.randperm(total - 1, device=dev) + 1
        bt = torch.zeros(batch, MAX_LEN // BLOCK, dtype=torch.int32, device=dev)
        at = 0
        for i, nb in enumerate(blocks_per):
            bt[i, :nb] = perm[at:at + nb].to(torch.int32)
            at += nb
        cl = torch.tensor(ctx, dtype=torch.int32, device=dev)
        q = torch.randn(batch, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
        auto = num_splits(batch, KV_HEADS, sms)
        ref = paged_decode_attention(q, k, v, bt, cl, splits=1).float()
        kv_bytes = sum(ctx) * KV_HEADS * HEAD_DIM * 2 * 2  # K and V, bf16
        row = {"batch": batch, "context_mean": round(statistics.fmean(ctx)), "auto_splits": auto, "us": {},
               "us_eager_call": {}, "max_abs_diff": {}}
        for s in sorted(set(SPLITS) | {auto}):
            out = paged_decode_attention(q, k, v, bt, cl, splits=s)
            row["max_abs_diff"][s] = float((out.float() - ref).abs().max())
            row["us"][s] = round(replayed(lambda: paged_decode_attention(q, k, v, bt, cl, splits=s)), 1)
            row["us_eager_call"][s] = round(timed(lambda: paged_decode_attention(q, k, v, bt, cl, splits=s)), 1)
        best = min(row["us"], key=row["us"].get)
        row["best_splits"] = best
        row["gbps_auto"] = round(kv_bytes / (row["us"][auto] * 1e-6) / 1e9)
        row["gbps_best"] = round(kv_bytes / (row["us"][best] * 1e-6) / 1e9)
        rows.append(row)
        print(json.dumps(row), flush=True)
        k = v = None  # the next batch's pool replaces this one
        torch.cuda.empty_cache()
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "sms": sms, "rows": rows}
    (args.out / "gpu_decode_splits.json").write_text(json.dumps(res, indent=1))
    md = [f"# Paged decode attention: split count against batch ({res['gpu']}, torch {res['torch']}, {sms} SMs)", "",
          "One layer's call replayed from a CUDA graph (µs; 20 replays back to back, median of 7 rounds); 32 layers "
          "make a step's attention. us_eager_call in the JSON: the same call made from Python (host launches "
          "included).", "",
          "| batch | mean context | heuristic's splits | µs at the heuristic's | best splits | µs at best | "
          "GB/s heuristic / best | 32 layers, ms saved |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b = r["us"][r["auto_splits"]], r["us"][r["best_splits"]]
        md.append(f"| {r['batch']} | {r['context_mean']} | {r['auto_splits']} | {a} | {r['best_splits']} | {b} | "
                  f"{r['gbps_auto']} / {r['gbps_best']} | {(a - b) * 32 / 1e3:.2f} |")
    md += ["", "Every split count (µs):", "", "| batch | " + " | ".join(str(s) for s in SPLITS) + " |",
           "|---|" + "---|" * len(SPLITS)]
    md += [f"| {r['batch']} | " + " | ".join(str(r["us"].get(s, "-")) for s in SPLITS) + " |" for r in rows]
    worst = max(d for r in rows for d in r["max_abs_diff"].values())
    md += ["", f"Largest difference of any split count's output from one split's: {worst:.3g} (bf16)"]
    (args.out / "gpu_decode_splits.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
