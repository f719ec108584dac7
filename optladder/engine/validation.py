"""Refuse, before anything loads, an engine setting that cannot run, naming the field and the fix."""
from __future__ import annotations

from optladder.engine.config import DEVICES, DTYPES, ENGINES, PLANTS, EngineConfig
from optladder.engine.opts import OPTS, enabled_opts


# engine=vllm: what vLLM cannot switch off (paged KV, continuous batching, batched detokenization) is in effect
# whatever our config says, so it meets the needs of the opts built on it (prefix_cache needs paged_kv) unasked;
# and two opts that are CUDA-only in the reference engine run on vLLM's CPU platform too: torch.compile
# (fused_kernels) and, with AMX, FP8 weights. optladder/backends/vllm_env.py decides those by the CPU's features.
ALWAYS_ON = {"vllm": ("paged_kv", "dynamic_batching", "batched_decode")}
NOT_CUDA_ONLY = {"vllm": ("fused_kernels", "quant_fp8")}


def validate_engine(cfg: EngineConfig, device_type: str) -> None:
    """device_type: 'cpu' or 'cuda', as resolved from engine.device."""
    _one_of("engine.name", cfg.name, ENGINES)
    _one_of("engine.dtype", cfg.dtype, DTYPES)
    _one_of("engine.device", cfg.device, DEVICES)
    if cfg.debug_plant is not None:
        _one_of("engine.debug_plant", cfg.debug_plant, PLANTS)
        if cfg.name != "reference":
            raise ValueError(f"engine.debug_plant={cfg.debug_plant!r} plants a bug in the reference engine only, "
                             f"not engine={cfg.name}; drop it")
    for name in ("max_model_len", "batch_size", "max_num_seqs", "max_num_batched_tokens", "block_size",
                 "piecewise_max_tokens"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"engine.{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.cpu_threads is not None and cfg.cpu_threads < 1:
        raise ValueError(f"engine.cpu_threads must be >= 1 (or null for torch's default), got {cfg.cpu_threads}")
    if cfg.batch_timeout_ms < 0:
        raise ValueError(f"engine.batch_timeout_ms must be >= 0, got {cfg.batch_timeout_ms}")
    if cfg.block_size & (cfg.block_size - 1):
        raise ValueError(f"engine.block_size must be a positive power of two, got {cfg.block_size}")
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        raise ValueError(f"engine.max_num_batched_tokens ({cfg.max_num_batched_tokens}) must be >= "
                         f"engine.max_num_seqs ({cfg.max_num_seqs}): every running sequence needs a token a step")
    if cfg.kv_cache_gb is not None and cfg.kv_cache_gb <= 0:
        raise ValueError(f"engine.kv_cache_gb must be > 0 (or null for a fraction of free memory), got {cfg.kv_cache_gb}")
    if not 0 < cfg.kv_cache_memory_fraction <= 1:
        raise ValueError(f"engine.kv_cache_memory_fraction must be in (0, 1], got {cfg.kv_cache_memory_fraction}")
    for spec in OPTS.values():
        if not getattr(cfg, spec.field):
            continue
        for need in spec.needs:
            if not getattr(cfg, OPTS[need].field) and need not in ALWAYS_ON.get(cfg.name, ()):
                raise ValueError(f"opt {spec.name} needs {need}: use '+opt=[{need},{spec.name}]'")
        if spec.cuda_only and device_type != "cuda" and spec.name not in NOT_CUDA_ONLY.get(cfg.name, ()):
            raise ValueError(f"opt {spec.name} runs on CUDA only, but the engine runs on {device_type}: "
                             f"drop +opt={spec.name} or run on a GPU (engine.device=cuda)")
    on = enabled_opts(cfg)
    if "piecewise_graphs" in on and cfg.name == "reference":  # the reference engine's pieces (optladder/engine/piecewise.py)
        other = [name for name in ("quant_int8", "quant_fp8", "kv_fp8") if name in on]
        if other:
            raise ValueError(f"opt piecewise_graphs is not supported with {', '.join(other)} (its pieces are "
                             f"checked with the model dtype's weights and KV only): drop +opt=piecewise_graphs "
                             f"or +opt={other[0]}")
        if "fused_kernels" in on and "flash_attn" not in on:
            raise ValueError("opt piecewise_graphs with fused_kernels needs flash_attn (the fused pieces' attention "
                             "reads K/V from the cache through the Triton varlen kernel; without it every step would "
                             "run eagerly): use '+opt=[flash_attn,...]' or drop +opt=piecewise_graphs")
    if "flash_attn" in on and device_type == "cuda" and cfg.dtype == "float32":
        raise ValueError("opt flash_attn on CUDA needs engine.dtype bfloat16 or float16 (the flash kernel has "
                         "no float32): set engine.dtype=bfloat16 or auto")


def validate_head_dim(cfg: EngineConfig, device_type: str, head_dim: int) -> None:
    """The kernels of the GPU opts take head dims that are multiples of 8 up to 256: PyTorch's flash
    kernel (flash_attn prefill), and the project's Triton paged-decode kernel (flash_attn decode over
    the paged cache, and every graph-captured decode step: optladder/engine/cuda_graphs.py says why)."""
    if device_type != "cuda" or (head_dim <= 256 and head_dim % 8 == 0):
        return
    for opt, kernel in (("flash_attn", "the flash and Triton paged-decode kernels"),
                        ("cuda_graphs", "the Triton paged-decode kernel that graph-captured decode runs")):
        if getattr(cfg, opt):
            raise ValueError(f"opt {opt}: head_dim {head_dim} is not supported by {kernel} (a multiple of 8, "
                             f"at most 256): drop +opt={opt} for this model")


def _one_of(field: str, value, valid) -> None:
    if value not in valid:
        raise ValueError(f"{field}={value!r} is not one of {list(valid)}")
