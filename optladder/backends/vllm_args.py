"""Our engine config as `vllm serve` arguments and environment: pure, no vLLM import, no I/O, so every
mapping is tested in milliseconds. Each opt becomes vLLM's own argument; what vLLM cannot switch off
(paged KV, continuous batching, batched detokenization) is reported as always on, never dropped.

Flag names are those of vLLM 0.32's EngineArgs (`vllm serve --help`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from optladder.backends.opt_map import ALWAYS_ON, FIXED, MAPPED, OptMapping, collect, refuse_unmapped, requested_opts
from optladder.engine.config import EngineConfig

GIB = 1 << 30
# quant_int8 is not here: vLLM has no weight-only int8 for an unquantized checkpoint (its int8 paths load
# checkpoints quantized ahead of time), so it is refused rather than silently run in the model dtype
SUPPORTED = ("paged_kv", "flash_attn", "dynamic_batching", "batched_decode", "cuda_graphs", "piecewise_graphs",
             "prefix_cache",
             "chunked_prefill", "fused_kernels", "speculative",  # skinny_gemm: vLLM has no switch for its GEMM kernels
             "quant_fp8", "kv_fp8")
CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU_ATTN kernel takes block sizes that are multiples of 32 only
# vLLM has no unfused attention: with flash_attn off on CUDA it runs its Triton paged kernel instead
CUDA_ATTENTION = {True: "FLASH_ATTN", False: "TRITON_ATTN"}
# (cuda_graphs, piecewise_graphs) -> vLLM's cudagraph_mode: full graphs for decode steps, and piecewise ones for
# the steps with prompt tokens when piecewise_graphs is on too
CUDA_GRAPH_MODE = {(True, True): "FULL_AND_PIECEWISE", (True, False): "FULL_DECODE_ONLY",
                   (False, False): "NONE", (False, True): "NONE"}


@dataclass
class VLLMLaunch:
    args: list[str]  # after `vllm serve`
    env: dict[str, str]  # added to the server's environment
    opts_effective: dict[str, dict]
    dtype: str


def resolve_dtype(dtype: str, device_type: str) -> str:
    """Our `auto` (bfloat16 on CUDA, float32 on CPU), not vLLM's (the checkpoint's), so both engines of an
    A/B compute in the same precision."""
    if dtype == "auto":
        return "bfloat16" if device_type == "cuda" else "float32"
    return dtype


def opt_mappings(cfg: EngineConfig, device_type: str) -> list[OptMapping]:
    want = set(requested_opts(cfg))
    refuse_unmapped("vllm", sorted(want), SUPPORTED)
    cpu = device_type == "cpu"
    if cpu and cfg.block_size % CPU_BLOCK_MULTIPLE:
        raise ValueError(f"engine.block_size={cfg.block_size}: vLLM's CPU attention kernel needs a multiple of "
                         f"{CPU_BLOCK_MULTIPLE} (valid e.g. 32, 64, 128); set engine.block_size=128 "
                         "(vLLM's CPU default)")
    if cpu and cfg.cuda_graphs:
        raise ValueError("opt cuda_graphs on engine=vllm needs CUDA, but vLLM runs on cpu here: drop +opt=cuda_graphs")
    maps = [
        speculative_mapping(cfg, "speculative" in want),
        OptMapping("paged_kv", "paged_kv" in want, ALWAYS_ON, True,
                   "vLLM's KV cache is always paged (PagedAttention); block size from engine.block_size",
                   ["--block-size", str(cfg.block_size)], extra={"block_size": cfg.block_size}),
        OptMapping("dynamic_batching", "dynamic_batching" in want, ALWAYS_ON, True,
                   "continuous batching is vLLM's only scheduler; engine.batch_size/batch_timeout_ms (static "
                   "batching) have no vLLM equivalent",
                   ["--max-num-seqs", str(cfg.max_num_seqs),
                    "--max-num-batched-tokens", str(cfg.max_num_batched_tokens)]),
        OptMapping("batched_decode", "batched_decode" in want, ALWAYS_ON, True,
                   "vLLM copies each step's sampled tokens to the host once for the whole batch and detokenizes "
                   "incrementally in its output processor"),
        OptMapping("prefix_cache", "prefix_cache" in want, MAPPED, cfg.prefix_cache,
                   "--enable-prefix-caching / --no-enable-prefix-caching (vLLM's default is on, so off is explicit)",
                   ["--enable-prefix-caching" if cfg.prefix_cache else "--no-enable-prefix-caching"]),
        OptMapping("chunked_prefill", "chunked_prefill" in want, MAPPED, cfg.chunked_prefill,
                   "--enable-chunked-prefill / --no-enable-chunked-prefill; off, vLLM's scheduler still puts whole "
                   "prompts and decodes in one step (it has no prompt-only steps), it only stops cutting prompts",
                   ["--enable-chunked-prefill" if cfg.chunked_prefill else "--no-enable-chunked-prefill"]),
    ]
    # quant_fp8 and kv_fp8 on a CPU: refused where vLLM's CPU kernels cannot run them (optladder/backends/vllm_env.py)
    maps.append(OptMapping("quant_fp8", "quant_fp8" in want, MAPPED, cfg.quant_fp8,
                           "--quantization fp8 when on (vLLM quantizes the checkpoint's weights to FP8 E4M3 as they "
                           "load, with its own scales; ours: one per output channel); off: the checkpoint's dtype",
                           ["--quantization", "fp8"] if cfg.quant_fp8 else []))
    maps.append(OptMapping("kv_fp8", "kv_fp8" in want, MAPPED, cfg.kv_fp8,
                           "--kv-cache-dtype fp8 when on (vLLM keeps one scale per layer, 1.0 unless the checkpoint "
                           "carries calibrated ones; ours: one per token and head); off: the model dtype",
                           ["--kv-cache-dtype", "fp8"] if cfg.kv_fp8 else []))
    if cpu:
        maps += [
            OptMapping("flash_attn", "flash_attn" in want, ALWAYS_ON, True,
                       "vLLM's CPU platform has one attention backend, CPU_ATTN (a fused paged kernel); "
                       "--attention-backend cannot select another", extra={"backend": "CPU_ATTN"}),
            OptMapping("cuda_graphs", False, FIXED, False,
                       "vLLM's CPU platform captures no graphs (it empties cudagraph_capture_sizes)"),
            OptMapping("piecewise_graphs", False, FIXED, False, "vLLM's CPU platform captures no graphs"),
            OptMapping("fused_kernels", "fused_kernels" in want, MAPPED, cfg.fused_kernels,
                       "torch.compile when on (vLLM's CPU default: Dynamo traced once, Inductor's C++ kernels); "
                       "compilation_config.mode NONE (eager) when off",
                       compile_args(cfg.fused_kernels, None), extra={"compilation_mode": compile_mode(cfg.fused_kernels)}),
        ]
    else:
        attn = CUDA_ATTENTION[cfg.flash_attn]
        mode = CUDA_GRAPH_MODE[cfg.cuda_graphs, cfg.piecewise_graphs]
        maps += [
            OptMapping("flash_attn", "flash_attn" in want, MAPPED, cfg.flash_attn,
                       "--attention-backend FLASH_ATTN when on; TRITON_ATTN when off (vLLM has no unfused "
                       "attention, so off compares two fused kernels)", ["--attention-backend", attn],
                       extra={"backend": attn}),
            OptMapping("cuda_graphs", "cuda_graphs" in want, MAPPED, cfg.cuda_graphs,
                       "compilation_config.cudagraph_mode FULL_DECODE_ONLY when on (FULL_AND_PIECEWISE with "
                       "piecewise_graphs), NONE when off (whether torch.compile runs is fused_kernels')",
                       compile_args(cfg.fused_kernels, mode), extra={"cudagraph_mode": mode}),
            OptMapping("piecewise_graphs", "piecewise_graphs" in want, MAPPED, cfg.piecewise_graphs,
                       "with cuda_graphs, compilation_config.cudagraph_mode FULL_AND_PIECEWISE when on (piecewise "
                       "graphs around attention for the steps with prompt tokens), FULL_DECODE_ONLY when off",
                       extra={"cudagraph_mode": mode}),
            OptMapping("fused_kernels", "fused_kernels" in want, MAPPED, cfg.fused_kernels,
                       "torch.compile when on (vLLM's default, VLLM_COMPILE: Inductor fuses its element-wise work); "
                       "compilation_config.mode NONE (eager) when off; in cuda_graphs' --compilation-config",
                       extra={"compilation_mode": compile_mode(cfg.fused_kernels)}),
        ]
    return maps


def compile_mode(fused: bool) -> str:
    """vLLM's compilation_config.mode for our fused_kernels: its own default (torch.compile) on, NONE off."""
    return "default" if fused else "NONE"


def compile_args(fused: bool, cudagraph_mode: str | None) -> list[str]:
    """The one --compilation-config of a launch: mode NONE (eager) without fused_kernels, vLLM's default
    (torch.compile) with it; on CUDA the cudagraph_mode too (FULL_DECODE_ONLY needs no compiled graph)."""
    cc = {} if fused else {"mode": "NONE"}
    if cudagraph_mode is not None:
        cc["cudagraph_mode"] = cudagraph_mode
    return ["--compilation-config", json.dumps(cc)] if cc else []


def speculative_mapping(cfg: EngineConfig, requested: bool) -> OptMapping:
    """method ngram -> --speculative-config {"method": "ngram", ...}: vLLM's prompt lookup (its own lookup
    rules: it does not continue a match into its drafts). vLLM has no draft from the target's own first layers
    and no switch to stop speculating above a batch size, so those are refused; off passes nothing (vLLM's
    default is no speculation)."""
    spec = cfg.speculative
    if not spec:
        return OptMapping("speculative", False, MAPPED, False, "no --speculative-config: vLLM does not speculate")
    if spec.method != "ngram":
        raise ValueError(f"engine.speculative.method={spec.method!r} has no vLLM equivalent (vLLM drafts from "
                         "n-grams, a separate draft model or trained heads, not the target's first layers): on "
                         "engine=vllm use engine.speculative.method=ngram")
    if spec.disable_by_batch_size is not None:
        raise ValueError(f"engine.speculative.disable_by_batch_size={spec.disable_by_batch_size}: vLLM has no "
                         "such switch; set it to null on engine=vllm")
    sc = {"method": "ngram", "num_speculative_tokens": spec.num_draft_tokens,
          "prompt_lookup_max": spec.ngram_max, "prompt_lookup_min": spec.ngram_min}
    return OptMapping("speculative", requested, MAPPED, True, "--speculative-config with method ngram",
                      ["--speculative-config", json.dumps(sc)], extra={"speculative_config": sc})


SHARED_GPU_FRACTION = 0.2  # engine.kv_cache_gb on a GPU: the free share vLLM's start-up check asks for


def kv_cache_settings(cfg: EngineConfig, device_type: str) -> tuple[list[str], dict[str, str]]:
    """engine.kv_cache_gb: on CPU vLLM's own knob, VLLM_CPU_KVCACHE_SPACE (whole GiB only), else the exact
    byte count; null: a fraction of memory (vLLM's gpu_memory_utilization, which on CPU is of RAM and on
    both counts the weights too, unlike the reference engine's fraction of free memory)."""
    if cfg.kv_cache_gb is None:
        return ["--gpu-memory-utilization", str(cfg.kv_cache_memory_fraction)], {}
    if device_type == "cpu" and float(cfg.kv_cache_gb).is_integer():
        return [], {"VLLM_CPU_KVCACHE_SPACE": str(int(cfg.kv_cache_gb))}
    # the CPU variable would override the exact size, so it is cleared for the server
    env = {"VLLM_CPU_KVCACHE_SPACE": ""} if device_type == "cpu" else {}
    args = ["--kv-cache-memory-bytes", str(math.floor(cfg.kv_cache_gb * GIB))]
    if device_type == "cuda" and "--gpu-memory-utilization" not in cfg.server.extra_args:
        # with an exact KV size vLLM reads the fraction only in its start-up check, free memory >= fraction x
        # total: at its default 0.9 a second server on the same GPU (a switchback's other arm, the teacher-forced
        # phase beside another engine) is refused however little both need
        args += ["--gpu-memory-utilization", str(SHARED_GPU_FRACTION)]
    return args, env


def check_tensor_parallel(tp: int, device_type: str, visible_gpus: int) -> None:
    """Refused before vLLM starts: vLLM would otherwise load for minutes, then fail in its NCCL set-up."""
    if tp == 1:
        return
    if device_type != "cuda":
        raise ValueError(f"engine.server.tensor_parallel_size={tp} splits the model across CUDA GPUs, but vLLM "
                         "runs on the CPU here: set it to 1")
    if tp > visible_gpus:
        raise ValueError(f"engine.server.tensor_parallel_size={tp}, but {visible_gpus} GPU(s) are visible here "
                         "(CUDA_VISIBLE_DEVICES, or what a launcher granted the job): at most "
                         f"{visible_gpus}, or give the job more GPUs (hydra.launcher.gpus_per_job)")


def build_launch(cfg: EngineConfig, device_type: str, model_dir: Path | str, served_model_name: str,
                 host: str, port: int, model_args: list[str] | None = None) -> VLLMLaunch:
    """Everything after `vllm serve`, server options first and engine.server.extra_args last, so a user's
    own flag wins over ours. model_args: what the model folder needs (`--load-format dummy` for a shape)."""
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device type {device_type!r} is not one of ['cpu', 'cuda']")
    opt_args, env, effective = collect(opt_mappings(cfg, device_type))
    dtype = resolve_dtype(cfg.dtype, device_type)
    kv_args, kv_env = kv_cache_settings(cfg, device_type)
    args = [str(model_dir), *(model_args or []), "--host", host, "--port", str(port), "--served-model-name", served_model_name,
            "--dtype", dtype, "--max-model-len", str(cfg.max_model_len), "--seed", str(cfg.seed),
            # the checkpoint's generation_config.json must not change sampling: every request sets its own
            "--generation-config", "vllm", "--disable-uvicorn-access-log",
            "--tensor-parallel-size", str(cfg.server.tensor_parallel_size),
            *kv_args, *opt_args, *cfg.server.extra_args]
    return VLLMLaunch(args, {**env, **kv_env, **cfg.server.env}, effective, dtype)
