"""The registry of optimizations: which engine field each turns on, whether it is lossless (greedy
outputs must not change), and what it needs. conf/opt/<name>.yaml sets the field; gates read `lossless`."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OptSpec:
    name: str
    field: str
    lossless: bool
    summary: str
    needs: tuple[str, ...] = ()
    cuda_only: bool = False


OPTS: dict[str, OptSpec] = {o.name: o for o in (
    OptSpec("paged_kv", "paged_kv", True, "KV in fixed-size blocks allocated on demand, freed at finish"),
    OptSpec("flash_attn", "flash_attn", True, "fused attention (SDPA flash on CUDA, Triton paged decode)"),
    OptSpec("dynamic_batching", "dynamic_batching", True, "continuous batching with preemption"),
    OptSpec("batched_decode", "batched_decode", True, "one host copy per step, batched detokenization"),
    OptSpec("cuda_graphs", "cuda_graphs", True, "decode steps replayed from CUDA graphs", cuda_only=True),
    OptSpec("prefix_cache", "prefix_cache", True, "reuse of full KV blocks by prefix hash",
            needs=("paged_kv",)),
)}


def enabled_opts(engine_cfg) -> list[str]:
    return [name for name, spec in OPTS.items() if getattr(engine_cfg, spec.field)]


def is_lossless(opt_names: list[str]) -> bool:
    unknown = [n for n in opt_names if n not in OPTS]
    if unknown:
        raise ValueError(f"unknown opt(s) {unknown}; valid: {sorted(OPTS)}")
    return all(OPTS[n].lossless for n in opt_names)
