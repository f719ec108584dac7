"""What each reference-engine switch buys on its own, on the CPU: one workload replayed with SmolLM2 against the
baseline, each lossless switch alone, and all of them together, in one process, on the same requests.

    optladder bench switches --out benchmarks/results/cpu_switches.md      (or python benchmarks/cpu_switches.py)
    optladder bench switches --configs baseline 'all on' \
        --variant 'all on:max_num_seqs=3,max_num_batched_tokens=64'   (a config with some engine fields changed)

Every config replays the identical open-loop workload (the builtin one: log-normal lengths, Poisson arrivals
fast enough to keep a static batch full) through backends.ReferenceBackend and the in-process
replay driver, with no MLflow. The KV budget is small on purpose: contiguous KV reserves max_model_len slots per
sequence, so the baseline is KV-bound and paged_kv's effect shows in admission, not only in the memory numbers.
Each config must also reproduce the baseline's greedy tokens, on the replay and on a few quality prompts.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from optladder.engine.config import EngineConfig, ModelConfig
from optladder.paths import CONF_DIR, PACKAGE
from optladder.engine.loader import load_tokenizer, model_shape
from optladder.engine.sequence import SamplingParams
from optladder.engine.tokenizer import chat_token_ids
from optladder.backends.engines import ReferenceBackend
from optladder.quality.prompts import QualityConfig, load_prompt_set
from optladder.traffic.metrics import compute_metrics
from optladder.engine.opts import switch_configs
from optladder.engine.validation import validate_engine
from optladder.traffic.replay_config import Pacing, ReplayConfig
from optladder.traffic.request import Request
from optladder.traffic.workload import WorkloadConfig, build_workload

CONFIGS = switch_configs()  # baseline, each switch alone (prefix_cache with paged_kv), all on
# (header, metric key, format)
COLUMNS = [("TTFT p50 ms", "perf/ttft_ms_p50", "{:,.0f}"), ("TPOT p50 ms", "perf/tpot_ms_p50", "{:,.1f}"),
           ("E2E p99 ms", "perf/e2e_ms_p99", "{:,.0f}"), ("req/s", "perf/throughput_req_s", "{:.3f}"),
           ("out tok/s", "perf/throughput_out_tok_s", "{:.1f}"), ("KV reserved GiB", "perf/kv_reserved_gb", "{:.3f}"),
           ("KV util", "perf/kv_util", "{:.2f}"), ("preemptions", "perf/preemptions", "{:.0f}"),
           ("prefix hit rate", "perf/prefix_hit_rate", "{:.2f}")]


@dataclass
class Result:
    metrics: dict[str, float]
    max_batch: int
    replay_texts: list[str]
    quality_ids: list[list[int]]
    seconds: float
    load: float  # the machine's 1-minute load average when the replay ended


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="optladder bench switches", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals, requests/s")
    p.add_argument("--kv-cache-gb", type=float, default=0.3)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--quality-prompts", type=int, default=4)
    p.add_argument("--no-repeat", action="store_true",
                   help="skip the baseline's second run at the end (it shows how much the machine drifted)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--variant", action="append", default=[], metavar="CONFIG:KEY=VALUE,...",
                   help="also run CONFIG with these engine fields changed, e.g. 'all on:max_num_seqs=3' (repeatable)")
    p.add_argument("--out", type=Path, default=None, help="also write the report here (markdown)")
    args = p.parse_args(argv)
    try:
        args.variants = [parse_variant(v) for v in args.variant]
        labels = [label for label, _, _ in args.variants]
        if len(set(labels)) < len(labels):
            raise ValueError(f"--variant: the same variant twice ({', '.join(sorted({x for x in labels if labels.count(x) > 1}))})")
        for label, name, fields in args.variants:  # refused here, before any config runs, not when its turn comes
            try:
                validate_engine(EngineConfig(**{**vars(base_engine(args)), **CONFIGS[name], **fields}), "cpu")
            except ValueError as e:
                raise ValueError(f"--variant {label!r}: {e}") from None
    except ValueError as e:
        p.error(str(e))
    return args


def base_engine(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(device="cpu", dtype="float32", max_model_len=args.max_model_len, kv_cache_gb=args.kv_cache_gb)


def parse_variant(text: str) -> tuple[str, str, dict]:
    """'all on:max_num_seqs=3,max_num_batched_tokens=64' -> (its label, the config, the engine fields)."""
    name, _, fields = text.partition(":")
    if name not in CONFIGS:
        raise ValueError(f"--variant {text!r}: the config before ':' is one of {', '.join(map(repr, CONFIGS))}")
    known = set(EngineConfig.__dataclass_fields__)
    out = {}
    for item in filter(None, fields.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--variant {text!r}: {item!r} is not KEY=VALUE with KEY an engine field "
                             f"(e.g. max_num_seqs, max_num_batched_tokens)")
        default = EngineConfig.__dataclass_fields__[key].default
        try:  # the field's own type: an int field takes an int, a float field a number, a bool field true/false
            if isinstance(default, bool):
                out[key] = {"true": True, "false": False}[value.lower()]
            elif isinstance(default, int):
                out[key] = int(value)
            elif isinstance(default, float):
                out[key] = float(value)
            elif isinstance(default, str):
                out[key] = value
            elif default is None:  # an optional number (kv_cache_gb may be null, cpu_threads an int)
                out[key] = None if value.lower() in ("none", "null") else (int(value) if value.lstrip("-").isdigit()
                                                                         else float(value))
            else:
                raise ValueError
        except (KeyError, ValueError):
            raise ValueError(f"--variant {text!r}: {key}={value!r} is not a {type(default).__name__}") from None
    if not out:
        raise ValueError(f"--variant {text!r}: give at least one KEY=VALUE after ':'")
    return f"{name}, " + ", ".join(f"{k}={v}" for k, v in out.items()), name, out


def run_config(model_cfg: ModelConfig, engine_cfg: EngineConfig, requests: list[Request], warm: list[Request],
               quality: list[list[int]]) -> Result:
    t0 = time.perf_counter()
    backend = ReferenceBackend(model_cfg, engine_cfg)
    # unrelated prompts: warming up on the replay's own would hand prefix_cache hits it did not earn
    backend.warmup(warm)
    records = backend.replay(requests, ReplayConfig(progress=False), Pacing("open"), on_record=lambda r: None)
    load = os.getloadavg()[0]
    metrics = {**compute_metrics(records), **backend.metrics()}
    if metrics["perf/requests_failed"]:
        raise RuntimeError(f"{metrics['perf/requests_failed']:.0f} requests failed: "
                           f"{[r.error for r in records if not r.ok][:3]}")
    max_batch = max(backend.opts_effective()["dynamic_batching"]["batch_sizes_seen"])
    seqs = backend.engine.generate(quality, SamplingParams(max_tokens=32, ignore_eos=False))
    assert backend.engine.block_manager.all_free(), "blocks leaked"
    backend.close()
    return Result(metrics, max_batch, [r.output_text for r in records], [s.output_token_ids for s in seqs],
                  time.perf_counter() - t0, load)


def cell(value: float, base: float, fmt: str) -> str:
    ratio = f" ({value / base:.2f}×)" if base else ""
    return fmt.format(value) + ratio


def table(results: dict[str, Result]) -> list[str]:
    base = results.get("baseline")
    head = ["config", *(h for h, _, _ in COLUMNS), "max batch", "load", "same tokens as baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        cells = [cell(r.metrics[k], base.metrics.get(k, 0.0) if base and name != "baseline" else 0.0, f)
                 if k in r.metrics else "-" for _, k, f in COLUMNS]
        same = "reference" if name == "baseline" or base is None else (
            f"replay {sum(a == b for a, b in zip(r.replay_texts, base.replay_texts))}/{len(r.replay_texts)}, "
            f"quality {sum(a == b for a, b in zip(r.quality_ids, base.quality_ids))}/{len(r.quality_ids)}")
        lines.append("| " + " | ".join([name, *cells, str(r.max_batch), f"{r.load:.1f}", same]) + " |")
    return lines


def header(args: argparse.Namespace, engine_cfg: EngineConfig, kv_bytes_per_token: int, workload,
           load_before: tuple) -> list[str]:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    reqs, e = workload.requests, engine_cfg
    contiguous_seqs = int(e.kv_cache_gb * (1 << 30)) // (e.max_model_len * kv_bytes_per_token)
    return [
        "# Reference engine switches on the CPU: SmolLM2-135M-Instruct",
        "",
        f"- command: `{' '.join(shlex.quote(a) for a in [sys.executable.replace(str(PACKAGE.parent) + '/', ''), *sys.argv])}`",
        f"- machine: {cpu}, {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} "
        f"threads, Python {platform.python_version()}; load average before the run "
        f"{', '.join(f'{x:.1f}' for x in load_before)}",
        "- model: SmolLM2-135M-Instruct (GGUF Q4_1 dequantized), float32, CPU",
        f"- workload: builtin, {len(reqs)} requests, Poisson at {args.rate} req/s (sent over "
        f"{workload.stats['traffic/duration_s']:.1f} s), input {sum(r.input_len for r in reqs)} tokens "
        f"(median {sorted(r.input_len for r in reqs)[len(reqs) // 2]}), output {sum(r.output_len for r in reqs)} "
        f"tokens (median {sorted(r.output_len for r in reqs)[len(reqs) // 2]}), exact output lengths, seed 0",
        f"- engine: kv_cache_gb={e.kv_cache_gb} (contiguous: {contiguous_seqs} sequences of "
        f"max_model_len={e.max_model_len}), batch_size={e.batch_size}, "
        f"batch_timeout_ms={e.batch_timeout_ms:g}, max_num_seqs={e.max_num_seqs}, block_size={e.block_size}",
        "- each cell: the value, and in brackets its ratio to the baseline. TTFT/TPOT/E2E lower is better; "
        "KV util = used / reserved, averaged over the steps; max batch = the largest batch the scheduler ran; "
        "load = the 1-minute load average as the replay ended",
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    model_cfg = ModelConfig(**OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "smollm2_135m.yaml")))
    engine_cfg = base_engine(args)
    tok = load_tokenizer(model_cfg)
    shape = model_shape(model_cfg)
    kv_bytes_per_token = shape.kv_bytes_per_token(4)  # float32
    workload = build_workload(WorkloadConfig(num_requests=args.requests, rate=args.rate, seed=0), tok,
                              args.max_model_len)
    items = load_prompt_set(QualityConfig(num_prompts=args.quality_prompts + 2), None)
    quality = [chat_token_ids(tok, it.prompt) for it in items[2:]]
    warm = [Request(f"warm-{i}", chat_token_ids(tok, it.prompt), output_len=4) for i, it in enumerate(items[:2])]
    results: dict[str, Result] = {}
    # on a shared machine the load drifts: the baseline runs again last, and the gap between its two runs
    # is the noise any ratio in the table should be read against
    runs = [(name, name, {}) for name in args.configs] + args.variants
    if "baseline" in args.configs and not args.no_repeat:
        runs.append(("baseline (again, last)", "baseline", {}))
    for label, name, fields in runs:
        cfg = EngineConfig(**{**vars(engine_cfg), **CONFIGS[name], **fields})
        results[label] = run_config(model_cfg, cfg, workload.requests, warm, quality)
        print(f"{label}: {results[label].seconds:.0f} s", file=sys.stderr, flush=True)
    lines = header(args, engine_cfg, kv_bytes_per_token, workload, load_before) + table(results)
    lines += ["", f"Total {sum(r.seconds for r in results.values()):.0f} s; load average after "
              f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}."]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    main()
