"""Greedy outputs of SmolLM2 (bf16) on the GPU with each switch of the registry (optladder/engine/opts.py) alone and
all on, against the baseline (and a float32 run of it): how many prompts keep their exact tokens."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.opts import switch_configs
from optladder.engine.sequence import SamplingParams
from gpubench.harness import log

ROOT = Path(__file__).resolve().parents[2]
FLOAT32 = "float32 reference (baseline in float32)"


def configs() -> dict[str, dict]:
    """Engine fields per config: the registry's (baseline, each switch with what it needs, all on) and the
    baseline in float32, the yardstick for bf16 rounding."""
    return {**switch_configs(include_cuda_only=True), FLOAT32: {"dtype": "float32"}}


def smollm2_greedy(cache_dir: str, num_prompts: int = 32, max_tokens: int = 96) -> dict:
    from optladder.engine.llm_engine import LLMEngine
    from optladder.engine.tokenizer import chat_token_ids

    mcfg = ModelConfig(cache_dir=cache_dir)
    lines = (ROOT / "optladder" / "quality" / "builtin_prompts.jsonl").read_text().splitlines()[:num_prompts]
    texts = [json.loads(x)["prompt"] for x in lines]
    runs, evidence, prompts = {}, {}, None
    for name, kw in configs().items():
        cfg = EngineConfig(**{**dict(dtype="bfloat16", device="cuda", max_model_len=1024, kv_cache_gb=1.0,
                                     max_num_seqs=32, batch_size=8), **kw})
        eng = LLMEngine(mcfg, cfg)
        if prompts is None:
            prompts = [chat_token_ids(eng.tokenizer, t) for t in texts]
        seqs = eng.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=False))
        runs[name] = [s.output_token_ids for s in seqs]
        evidence[name] = {k: v for k, v in eng.opts_effective().items() if v.get("on")}
        if name == "baseline":  # eager twice: is the baseline itself deterministic?
            runs["baseline (again)"] = [s.output_token_ids for s in
                                        eng.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=False))]
        del eng
        torch.cuda.empty_cache()
        log(f"smollm2 {name}: done")
    base, f32 = runs["baseline"], runs[FLOAT32]
    table = []
    for name, outs in runs.items():
        if name == "baseline":
            continue
        firsts = [first_divergence(a, b) for a, b in zip(base, outs)]
        diverged = [f for f in firsts if f is not None]
        vs_f32 = [first_divergence(a, b) for a, b in zip(f32, outs)]
        table.append({"config": name, "identical": sum(f is None for f in firsts), "prompts": len(firsts),
                      "share_identical": sum(f is None for f in firsts) / len(firsts),
                      "first_divergence_positions": sorted(diverged),
                      "identical_to_float32": sum(f is None for f in vs_f32),
                      "mean_output_tokens": sum(map(len, outs)) / len(outs), "opts_effective": evidence.get(name)})
    table.append({"config": "baseline", "identical": len(base), "prompts": len(base), "share_identical": 1.0,
                  "first_divergence_positions": [],
                  "identical_to_float32": sum(first_divergence(a, b) is None for a, b in zip(f32, base)),
                  "mean_output_tokens": sum(map(len, base)) / len(base)})
    return {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized, run in bf16; one float32 run as reference)",
            "prompts": num_prompts,
            "max_tokens": max_tokens, "stop_at_eos": True, "compared_to": "baseline (every switch off: naive "
            "attention, contiguous KV, static batching, eager)", "rows": table}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
