"""Weight-only int8 on a CPU: decode ms per step with float32 weights, int8 through the C kernel
(optladder/engine/kernels/cpu_int8.py) and int8 dequantized before F.linear (the path without it), side by side in one
run. SmolLM2-135M-Instruct in float32, greedy, EOS ignored, fixed synthetic prompts.

Per batch size B, the three arms take turns (round-robin, --rounds times) so they share the machine's noise;
decode ms per step = (time for 1 + STEPS tokens - time for 1 token) / STEPS, the median over rounds; the ratio
to float32 is taken within each round (the arms ran back to back), then the median and the range over rounds.

    .venv/bin/python benchmarks/cpu_quant.py --out benchmarks/results/cpu_quant.md
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from optladder.engine.config import EngineConfig, ModelConfig  # noqa: E402
from optladder.engine.kernels import cpu_int8  # noqa: E402
from optladder.engine.llm_engine import LLMEngine  # noqa: E402
from optladder.engine.quant import model_weight_bytes  # noqa: E402
from optladder.engine.sequence import SamplingParams  # noqa: E402

ARMS = {"float32": ({}, True), "int8, C kernel": ({"quant_int8": True}, True),
        "int8, dequantize + F.linear": ({"quant_int8": True}, False)}  # name -> (engine fields, C kernel on)


def timed(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> float:
    t0 = time.perf_counter()
    engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    base = dict(device="cpu", dtype="float32", cpu_threads=args.threads, max_model_len=512, kv_cache_gb=0.2,
                paged_kv=True, flash_attn=True, dynamic_batching=True, batched_decode=True,
                max_num_seqs=max(batches))
    engines = {name: LLMEngine(ModelConfig(), EngineConfig(**base, **kw)) for name, (kw, _) in ARMS.items()}
    if cpu_int8.kernel() is None:
        print(f"the C kernel is not available: {cpu_int8.unavailable()}")
        return 1
    ms: dict[tuple[str, int], list[float]] = {}
    with tqdm(total=len(batches) * args.rounds * len(ARMS), desc="decode") as bar:
        for b in batches:
            prompts = [[3 + (7 * i + j) % 40000 for j in range(args.prompt_len)] for i in range(b)]
            for name, (_, c_on) in ARMS.items():  # warm-up
                cpu_int8.ENABLED = c_on
                timed(engines[name], prompts, 2)
            for _ in range(args.rounds):
                for name, (_, c_on) in ARMS.items():
                    cpu_int8.ENABLED = c_on
                    e = engines[name]
                    dt = timed(e, prompts, args.steps + 1) - timed(e, prompts, 1)
                    ms.setdefault((name, b), []).append(1000 * dt / args.steps)
                    bar.update()
    cpu_int8.ENABLED = True
    cmd = (f".venv/bin/python benchmarks/cpu_quant.py --batches {args.batches} --prompt-len {args.prompt_len} "
           f"--steps {args.steps} --rounds {args.rounds} --threads {args.threads}")
    lines = ["# Weight-only int8 on a CPU: decode ms per step, side by side", "",
             f"- command: `{cmd}`",
             f"- SmolLM2-135M-Instruct, float32 activations, {platform.processor() or platform.machine()} "
             f"({torch.get_num_threads()} torch thread(s)), torch {torch.__version__}, Python "
             f"{platform.python_version()}; paged_kv, flash_attn, dynamic_batching, batched_decode on in every arm",
             f"- prompts of {args.prompt_len} tokens, {args.steps} decode steps, EOS ignored; the arms take turns, "
             f"{args.rounds} rounds, median (all rounds in brackets); vs float32: the median of the per-round ratios "
             "[lowest, highest]", "",
             "| arm | weight bytes | " + " | ".join(f"batch {b} ms/step" for b in batches)
             + " | " + " | ".join(f"batch {b} vs float32" for b in batches) + " | kernels that ran |",
             "|---|---|" + "---|" * (2 * len(batches)) + "---|"]
    for name in ARMS:
        e = engines[name]
        med = {b: statistics.median(ms[(name, b)]) for b in batches}
        ratios = {b: [x / r for x, r in zip(ms[(name, b)], ms[("float32", b)])] for b in batches}
        kern = e.opts_effective().get("quant_int8", {}).get("kernels", {})
        lines.append(f"| {name} | {model_weight_bytes(e.model) / 2**20:,.0f} MiB | "
                     + " | ".join(f"{med[b]:.1f} [{', '.join(f'{x:.1f}' for x in ms[(name, b)])}]" for b in batches)
                     + " | " + " | ".join(f"{statistics.median(ratios[b]):.2f}x [{min(ratios[b]):.2f}, "
                                          f"{max(ratios[b]):.2f}]" for b in batches)
                     + f" | {', '.join(sorted(kern)) or '-'} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
