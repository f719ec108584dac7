"""Decode latency of the reference engine at fixed batch sizes, a baseline and a candidate side by side.

    optladder bench latency --model tiny --batch 1 8 --opt paged_kv --opt flash_attn
    optladder bench latency --model llama3_8b_shape --device cuda --batch 1 8 32 --opt cuda_graphs   (a GPU)

Each configuration is one engine, warmed up once before anything is timed. A measurement is one greedy
batch of --batch random prompts: the steps after every sequence has its first token are timed, so a decode
step's time is theirs over their count (tokens - 1 steps where the batch stays whole). The configurations are measured alternately (A B B A ...) over --repeats, so
drift on a shared machine hits both, and the table gives each one's median, the candidate's ratio to the
baseline and the peak memory. Random-weight models measure speed only, never quality.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

import torch
from omegaconf import OmegaConf

from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.llm_engine import LLMEngine
from optladder.engine.loader import model_shape, resolve_device
from optladder.engine.sequence import SamplingParams
from optladder.engine.validation import validate_engine
from optladder.paths import CONF_DIR, conf_options


def model_config(name: str) -> ModelConfig:
    if name not in conf_options("model"):
        raise ValueError(f"--model {name!r} is not one of {conf_options('model')}")
    return ModelConfig(**OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")))


def engine_config(opts: list[str], base: dict) -> EngineConfig:
    """EngineConfig with each conf/opt file's engine fields on top of base (what +opt=X does to engine.*)."""
    cfg = OmegaConf.merge(OmegaConf.structured(EngineConfig), base)
    for opt in opts:
        if opt not in conf_options("opt"):
            raise ValueError(f"--opt {opt!r} is not one of {conf_options('opt')}")
        cfg = OmegaConf.merge(cfg, OmegaConf.load(CONF_DIR / "opt" / f"{opt}.yaml"))
    return OmegaConf.to_object(cfg)


@dataclass
class Timings:
    step_ms: dict[int, list[float]] = field(default_factory=dict)  # batch -> one decode step's time per repeat
    peak_gb: float = 0.0


def measure(engine: LLMEngine, batch: int, prompt_len: int, tokens: int, vocab: int, seed: int) -> float:
    """One decode step's time in ms: the steps after every sequence of the batch has its first token, timed
    until the last finishes, over their count."""
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    seqs = [engine.add_request(f"bench-{seed}-{batch}-{i}", torch.randint(3, vocab, (prompt_len,), generator=gen).tolist(),
                               params, arrival_time=0.0) for i in range(batch)]
    start, steps = None, 0
    while engine.has_unfinished():
        engine.step()
        if start is not None:
            steps += 1
        elif all(s.num_output_tokens >= 1 for s in seqs):
            start = time.perf_counter()
    assert start is not None and steps > 0, "every sequence ran more than one step"
    return (time.perf_counter() - start) / steps * 1e3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="optladder bench latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help=f"one of {conf_options('model')}")
    p.add_argument("--opt", action="append", default=[], help="the candidate's opts (repeatable); none: baseline only")
    p.add_argument("--base-opt", action="append", default=[], help="opts both configurations have (repeatable)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--tokens", type=int, default=32, help="tokens generated per measurement (>= 2)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-gb", type=float, default=1.0)
    args = p.parse_args(argv)
    if args.tokens < 2 or args.repeats < 1 or min(args.batch) < 1 or args.prompt_len < 1:
        p.error(f"--tokens must be >= 2 (got {args.tokens}), --repeats, --batch and --prompt-len >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = {"device": args.device, "dtype": args.dtype, "kv_cache_gb": args.kv_cache_gb,
            "max_num_seqs": max(args.batch), "max_model_len": args.prompt_len + args.tokens + 16}
    try:
        model = model_config(args.model)
        configs = {"baseline": engine_config(args.base_opt, base)}
        if args.opt:
            configs["+" + ",".join(args.opt)] = engine_config([*args.base_opt, *args.opt], base)
        device = resolve_device(args.device)
        for cfg in configs.values():  # refused before any model loads
            validate_engine(cfg, device.type)
    except ValueError as e:
        raise SystemExit(f"optladder: error: {e}") from None
    vocab = model_shape(model).vocab_size
    timings = {label: Timings() for label in configs}
    engines: dict[str, LLMEngine] = {}
    for label, cfg in configs.items():
        engines[label] = LLMEngine(model, cfg)
        measure(engines[label], min(args.batch), args.prompt_len, 4, vocab, seed=99)  # warm-up, not timed
    order = list(configs)
    for r in range(args.repeats):
        for label in order if r % 2 == 0 else order[::-1]:
            for b in args.batch:
                timings[label].step_ms.setdefault(b, []).append(
                    measure(engines[label], b, args.prompt_len, args.tokens, vocab, seed=r))
    for label, engine in engines.items():
        timings[label].peak_gb = engine.memory_metrics()["perf/peak_mem_gb"]
    print(report(args, timings, torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"))
    return 0


def report(args: argparse.Namespace, timings: dict[str, Timings], dev: str) -> str:
    labels = list(timings)
    lines = [f"decode step, model {args.model}, prompt {args.prompt_len} tokens, {args.tokens} generated, "
             f"median of {args.repeats} alternating repeats; {dev}, torch {torch.__version__}", "",
             "| batch | " + " | ".join(f"{x} ms/step" for x in labels) + " | " +
             " | ".join(f"{x} tok/s" for x in labels) + (" | ratio |" if len(labels) > 1 else ""),
             "|---" * (1 + 2 * len(labels) + (len(labels) > 1)) + "|"]
    for b in args.batch:
        med = [statistics.median(timings[x].step_ms[b]) for x in labels]
        row = [f"{m:.2f}" for m in med] + [f"{b / m * 1e3:,.0f}" if m else "-" for m in med]
        if len(labels) > 1:
            row.append(f"{med[1] / med[0]:.3f}" if med[0] else "-")
        lines.append(f"| {b} | " + " | ".join(row) + " |")
    lines += ["", "peak memory: " + ", ".join(f"{x} {timings[x].peak_gb:.2f} GB" for x in labels)]
    return "\n".join(lines)
