"""Speculative decoding on a CPU: batch-1 decode speed with and without it, side by side in one run, on a
repeat-heavy prompt set (benchmarks/data/rewrite_prompts.jsonl: rewrite, fix, reformat text and code, whose
answers repeat much of the prompt) and on the built-in quality set. SmolLM2-135M-Instruct, float32, greedy
up to --max-new-tokens, stopping at EOS, the chat template.

Each prompt runs on every arm in turn (baseline, n-gram, first-layers draft), one request at a time, so the
arms share the machine's noise; per arm: decode ms per output token ((last token - first token) / (n - 1),
summed over prompts), the ratio to the baseline, the acceptance rate, tokens per verification, and whether
every output is the baseline's exact text.

    .venv/bin/python benchmarks/cpu_spec.py --out benchmarks/results/cpu_spec.md
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from optladder.engine.config import EngineConfig, ModelConfig, SpeculativeConfig  # noqa: E402
from optladder.engine.llm_engine import LLMEngine  # noqa: E402
from optladder.engine.sequence import SamplingParams  # noqa: E402
from optladder.engine.tokenizer import chat_token_ids  # noqa: E402
from optladder.quality.prompts import QualityConfig, load_prompt_set  # noqa: E402
from optladder.quality.user_sets import read_user_set  # noqa: E402

REWRITE = Path(__file__).resolve().parent / "data" / "rewrite_prompts.jsonl"


@dataclass
class Arm:
    name: str
    cfg: EngineConfig
    decode_s: float = 0.0
    decode_tokens: int = 0  # output tokens after the first
    outputs: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)


def spec_arms(k: int, draft_layers: int) -> dict[str, dict]:
    """The three arms, name -> engine fields on top of the shared ones: no speculation, ngram, draft_layers."""
    return {
        "baseline (no speculation)": {},
        f"ngram (k={k})": {"speculative": SpeculativeConfig("ngram", num_draft_tokens=k)},
        f"draft_layers ({draft_layers} of 30, k={k})":
            {"speculative": SpeculativeConfig("draft_layers", num_draft_tokens=k, num_draft_layers=draft_layers)},
    }


def one_request(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[str, float, int]:
    """The output text, the decode time (first token to last) and the tokens decoded after the first."""
    engine.add_request("r", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=False))
    first = last = None
    n = 0
    text = ""
    while engine.has_unfinished():
        for ev in engine.step():
            now = time.perf_counter()
            first = now if first is None else first
            last, n, text = now, ev.num_output_tokens, text + ev.text
    return text, last - first, n - 1


def run_set(arms: list[Arm], engines: dict[str, LLMEngine], prompts: list[list[int]], max_tokens: int,
            label: str) -> None:
    for engine in engines.values():
        engine.reset_stats()
    for prompt in tqdm(prompts, desc=label):
        for arm in arms:  # every arm on the same prompt in turn: the machine's noise is shared
            text, secs, n = one_request(engines[arm.name], prompt, max_tokens)
            arm.outputs.append(text)
            arm.decode_s += secs
            arm.decode_tokens += n
    for arm in arms:
        arm.evidence = engines[arm.name].opts_effective()["speculative"]


def table(arms: list[Arm], label: str, num_prompts: int) -> list[str]:
    base = arms[0]
    ms = {a.name: 1000 * a.decode_s / max(1, a.decode_tokens) for a in arms}
    lines = [f"### {label} ({num_prompts} prompts)", "",
             "| arm | decode ms/token | speed-up | output tokens | acceptance | tokens/verification | exact outputs |",
             "|---|---|---|---|---|---|---|"]
    for a in arms:
        ev = a.evidence
        same = sum(x == y for x, y in zip(a.outputs, base.outputs))
        acc = f"{ev['acceptance_rate']:.2f}" if ev.get("on") else "-"
        tpv = f"{ev['tokens_per_verification']:.2f}" if ev.get("on") else "-"
        lines.append(f"| {a.name} | {ms[a.name]:.1f} | {ms[base.name] / ms[a.name]:.2f}x | "
                     f"{a.decode_tokens + num_prompts} | {acc} | {tpv} | {same}/{num_prompts} |")
    return lines + [""]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rewrite-prompts", type=int, default=30)
    p.add_argument("--builtin-prompts", type=int, default=30)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-draft-tokens", type=int, default=4)
    p.add_argument("--draft-layers", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    # a small KV pool each: three engines (three copies of the weights) share the machine's memory
    base = dict(device="cpu", dtype="float32", cpu_threads=args.threads, max_model_len=1024, kv_cache_gb=0.1,
                paged_kv=True, flash_attn=True, dynamic_batching=True, batched_decode=True)
    k = args.num_draft_tokens
    configs = spec_arms(k, args.draft_layers)
    engines = {name: LLMEngine(ModelConfig(), EngineConfig(**base, **kw)) for name, kw in configs.items()}
    tok = next(iter(engines.values())).tokenizer
    sets = {"repeat-heavy set (rewrite / fix / reformat)": read_user_set(REWRITE)[0][:args.rewrite_prompts],
            "built-in quality set": load_prompt_set(QualityConfig(num_prompts=args.builtin_prompts), None)}
    lines = ["# Speculative decoding on a CPU: batch-1 decode, side by side", "",
             f"- command: `.venv/bin/python benchmarks/cpu_spec.py --rewrite-prompts {args.rewrite_prompts} "
             f"--builtin-prompts {args.builtin_prompts} --max-new-tokens {args.max_new_tokens} "
             f"--num-draft-tokens {k} --draft-layers {args.draft_layers} --threads {args.threads}`",
             f"- SmolLM2-135M-Instruct, float32, {platform.processor() or platform.machine()} "
             f"({torch.get_num_threads()} torch thread(s)), torch {torch.__version__}; every arm with paged_kv, "
             "flash_attn, dynamic_batching and batched_decode; one request at a time, greedy, stop at EOS, chat template",
             "- decode ms/token: (last token time - first token time) summed over prompts, over the tokens after the "
             "first; exact outputs: text identical to the baseline arm's", ""]
    all_same = True
    for label, items in sets.items():
        arms = [Arm(name, engines[name].cfg) for name in configs]
        prompts = [chat_token_ids(tok, it.chat()) for it in items]
        run_set(arms, engines, prompts, args.max_new_tokens, label)
        lines += table(arms, label, len(prompts))
        all_same &= all(a.outputs == arms[0].outputs for a in arms)
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
