"""Do the lossless switches keep SmolLM2's greedy outputs? Each switch alone and all together against the
baseline, on the whole built-in quality set, float32 on the CPU, exact text; and chunked prefill with a token
budget of 16, so that every prompt is split across steps and decodes are mixed into every step.

    .venv/bin/python benchmarks/quality_equivalence.py --out benchmarks/results/quality_equivalence.md
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from optladder.engine.config import EngineConfig, ModelConfig  # noqa: E402
from optladder.engine.llm_engine import LLMEngine  # noqa: E402
from optladder.engine.loader import load_tokenizer  # noqa: E402
from optladder.engine.opts import switch_configs  # noqa: E402
from optladder.engine.sequence import SamplingParams  # noqa: E402
from optladder.engine.tokenizer import chat_token_ids  # noqa: E402
from optladder.quality.prompts import QualityConfig, load_prompt_set  # noqa: E402


# chunked prefill with a budget small enough that every prompt of the set is split (max_num_seqs must fit it)
SPLIT = {f"{name} (budget 16: every prompt split)": {**switches, "max_num_batched_tokens": 16}
         for name, switches in switch_configs().items() if switches.get("chunked_prefill")}


def outputs(engine_cfg: EngineConfig, prompts: list[list[int]], max_tokens: int) -> tuple[list[str], float]:
    t0 = time.perf_counter()
    engine = LLMEngine(ModelConfig(), engine_cfg)
    seqs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=False))
    assert engine.block_manager.all_free(), "blocks leaked"
    return [s.output_text for s in seqs], time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--configs", nargs="*", default=None, help="names to run (default: all); 'baseline' is always run")
    args = p.parse_args()
    items = load_prompt_set(QualityConfig(num_prompts=args.prompts), None)
    tokenizer = load_tokenizer(ModelConfig())
    prompts = [chat_token_ids(tokenizer, it.prompt) for it in items]
    results: dict[str, tuple[list[str], float]] = {}
    configs = {**switch_configs(), **SPLIT}
    for name in ["baseline", *[n for n in (args.configs or configs) if n != "baseline"]]:
        cfg = EngineConfig(device="cpu", dtype="float32", **configs[name])
        results[name] = outputs(cfg, prompts, args.max_new_tokens)
        print(f"{name}: {time.strftime('%H:%M:%S')}", flush=True)
    base = results["baseline"][0]
    lines = ["# Greedy outputs of each lossless switch against the baseline", "",
             f"- command: `.venv/bin/python benchmarks/quality_equivalence.py --prompts {args.prompts} "
             f"--max-new-tokens {args.max_new_tokens}`",
             f"- SmolLM2-135M-Instruct, float32, CPU ({platform.processor() or platform.machine()}), torch "
             f"{torch.__version__}; built-in quality set, chat template, greedy, stop at EOS", "",
             "| config | identical outputs (exact text) | first differing prompt | time s |", "|---|---|---|---|"]
    for name, (outs, secs) in results.items():
        same = sum(a == b for a, b in zip(outs, base))
        first = next((items[i].id for i, (a, b) in enumerate(zip(outs, base)) if a != b), "-")
        lines.append(f"| {name} | {same}/{len(base)} | {first} | {secs:.0f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0 if all(o == base for o, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
