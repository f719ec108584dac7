"""The registry of optimizations: which engine field each turns on, whether it is lossless (greedy
outputs must not change), and what it needs. optladder/conf/opt/<name>.yaml sets the field; gates read `lossless`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optladder.engine.config import SpeculativeConfig


@dataclass(frozen=True)
class OptSpec:
    """on: the field's value that turns the opt on (True for the boolean switches; a nested settings
    dataclass is truthy when on, so `getattr(cfg, field)` says whether any opt is on)."""

    name: str
    field: str
    lossless: bool
    summary: str
    needs: tuple[str, ...] = ()
    cuda_only: bool = False
    on: Any = True


OPTS: dict[str, OptSpec] = {o.name: o for o in (
    OptSpec("paged_kv", "paged_kv", True, "KV in fixed-size blocks allocated on demand, freed at finish"),
    OptSpec("flash_attn", "flash_attn", True, "fused attention (SDPA flash on CUDA, Triton paged decode)"),
    OptSpec("dynamic_batching", "dynamic_batching", True, "continuous batching with preemption"),
    OptSpec("batched_decode", "batched_decode", True, "one host copy per step, batched detokenization"),
    OptSpec("cuda_graphs", "cuda_graphs", True, "decode steps replayed from CUDA graphs", cuda_only=True),
    OptSpec("piecewise_graphs", "piecewise_graphs", True,
            "steps with prompt tokens (prefill, mixed) replayed from CUDA graphs cut around an eager attention",
            needs=("cuda_graphs",), cuda_only=True),
    OptSpec("fused_kernels", "fused_kernels", True,
            "decode steps through fused element-wise Triton kernels (6 kernels a layer, not ~30)", cuda_only=True),
    OptSpec("skinny_gemm", "skinny_gemm", True, "decode linear layers of up to 16 rows through a Triton GEMV",
            needs=("fused_kernels",), cuda_only=True),
    OptSpec("prefix_cache", "prefix_cache", True, "reuse of full KV blocks by prefix hash",
            needs=("paged_kv",)),
    OptSpec("chunked_prefill", "chunked_prefill", True,
            "every step one token budget: running decodes first, then prompt chunks",
            needs=("paged_kv", "dynamic_batching")),
    OptSpec("quant_int8", "quant_int8", False, "weight-only int8, one scale per output channel"),
    OptSpec("quant_fp8", "quant_fp8", False, "FP8 E4M3 weights, one scale per output channel (capability >= 8.9)",
            cuda_only=True),
    OptSpec("kv_fp8", "kv_fp8", False, "KV cache in FP8 E4M3, one scale per token and KV head"),
    # lossless: greedy verification keeps the target's own tokens (sampling: rejection sampling, same distribution)
    OptSpec("speculative", "speculative", True,
            "drafts (n-gram prompt lookup, or the model's first layers) verified several tokens a step",
            on=SpeculativeConfig(method="ngram")),
)}


def enabled_opts(engine_cfg) -> list[str]:
    return [name for name, spec in OPTS.items() if getattr(engine_cfg, spec.field)]


def is_lossless(opt_names: list[str]) -> bool:
    unknown = [n for n in opt_names if n not in OPTS]
    if unknown:
        raise ValueError(f"unknown opt(s) {unknown}; valid: {sorted(OPTS)}")
    return all(OPTS[n].lossless for n in opt_names)


def switch_configs(include_cuda_only: bool = False) -> dict[str, dict[str, Any]]:
    """The configs that show what each lossless switch buys: the baseline, each switch alone (with what it
    needs), and all of them on. Engine field -> its on value, keyed by a readable name. Lossy opts
    (quantization) are left out: these configs must give the baseline's exact outputs."""
    out: dict[str, dict[str, Any]] = {"baseline": {}}
    specs = [o for o in OPTS.values() if o.lossless and (include_cuda_only or not o.cuda_only)]
    for spec in specs:
        names = [*spec.needs, spec.name]
        out["+".join(names)] = {OPTS[n].field: OPTS[n].on for n in names}
    out["all on"] = {o.field: o.on for o in specs}
    return out
