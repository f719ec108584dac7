"""flash_attn and cuda_graphs on one GPU, in one run: correctness checks, then micro-benchmarks, then JSON and
a markdown table.

    python benchmarks/gpu_bench.py --out DIR [--smollm2-cache DIR]     (benchmarks/gpu_run.sh on the H200)

1. copy bandwidth (bytes read + written), the ceiling every floor below is computed from (gpubench/harness.py);
2. kernels against float64 on fresh random inputs, outputs poisoned first (NaN never passes): the paged
   decode kernel (paged and contiguous layouts, split-K, GQA groups of 4 and 3), the fused decode-step
   kernels and the skinny GEMM, flash and naive prefill (gpubench/checks.py); and one whole decode step,
   graph-replayed vs eager (gpubench/llama.py);
3. prefill of 512/2048/4096 tokens on llama3_8b_shape, naive vs flash: time and peak memory;
4. decode step at batch 1/8/32/64 on llama3_8b_shape (bf16, random weights, 1024-token contexts), paged
   and contiguous KV, eager vs CUDA graphs (with and without the fused kernels and the skinny GEMM),
   each against the floor of reading the weights and the KV once at the measured bandwidth;
5. greedy outputs of SmolLM2 (bf16) with each switch of optladder/engine/opts.py alone and all on, on 32 builtin
   prompts (gpubench/smollm2.py);
6. the report (gpubench/report.py; `python benchmarks/gpu_bench.py --report gpu_bench.json` redraws it
   from saved results on any machine).
Imports only torch, transformers (through engine.loader) and triton, and the engine.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gpubench.report import markdown  # noqa: E402


def run(out: Path, smollm2_cache: str | None, skip: set[str]) -> None:
    import torch

    from optladder.engine.loader import load_model
    from optladder.engine.model_runner import kv_bytes_per_token
    from gpubench import checks, llama
    from gpubench.harness import BF16, DEV, RESULTS, copy_bandwidth, environment, log, save, section
    from gpubench.smollm2 import smollm2_greedy

    random.seed(0)
    RESULTS["environment"] = environment(" ".join(sys.argv))
    log(RESULTS["environment"])
    section("bandwidth", out)(copy_bandwidth)
    for name, fn in (("check_paged_decode", checks.check_paged_decode), ("check_fused", checks.check_fused),
                     ("check_prefill", checks.check_prefill)):
        if name not in skip:
            section(name, out)(fn)
    model = load_model(llama.LLAMA8B, DEV, BF16, seed=0)
    RESULTS["llama3_8b_shape"] = {"params": sum(p.numel() for p in model.parameters()),
                                  "weights_read_per_decode_step_bytes": llama.weights_read_bytes(model),
                                  "kv_bytes_per_token": kv_bytes_per_token(model, BF16)}
    if "check_decode_step" not in skip:
        section("check_decode_step", out)(lambda: llama.decode_step_equivalence(model))  # noqa: F821 (run before the del below)
    if "prefill" not in skip:
        section("prefill", out)(lambda: llama.prefill_bench(model))  # noqa: F821 (run before the del below)
    bw = RESULTS["bandwidth"].get("tb_s", 4.3)
    if "decode" not in skip:
        section("decode", out)(lambda: llama.decode_bench(model, bw))  # noqa: F821 (run before the del below)
    del model
    torch.cuda.empty_cache()
    if smollm2_cache and "smollm2" not in skip:
        section("smollm2", out)(lambda: smollm2_greedy(smollm2_cache))
    md = markdown(RESULTS)
    (out / "gpu_bench.md").write_text(md)
    save(out)
    log(md)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="where gpu_bench.json and gpu_bench.md go (needed to run the bench)")
    ap.add_argument("--smollm2-cache", default=None, help="cache_dir holding (or to hold) SmolLM2's conversion")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    ap.add_argument("--report", type=Path, default=None, help="only print the report of a saved gpu_bench.json")
    args = ap.parse_args()
    if args.report:
        print(markdown(json.loads(args.report.read_text())))
        return
    if not args.out:
        ap.error("--out DIR is required to run the bench (or --report FILE to redraw a saved one)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run(out, args.smollm2_cache, set(filter(None, args.skip.split(","))))


if __name__ == "__main__":
    main()
