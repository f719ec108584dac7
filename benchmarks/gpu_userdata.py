"""On a GPU, in one call: the KV planner against the engine's own sizing, and a profiled replay with device times.

    python3 benchmarks/gpu_userdata.py --out "$OUT"                 # the H200: llama3_8b_shape, bf16
    python3 benchmarks/gpu_userdata.py --out /tmp/x --device cpu    # the CPU path: the tiny model

1. plan_vs_engine.md / .json: the planner's block count for engine.kv_cache_gb=null (kv_cache_memory_fraction
   of the memory left after the weights, on a GPU of the device's total memory) next to the block count the
   engine really allocated there (it measures free memory after loading the weights, so the CUDA context and
   whatever else holds memory come out of its budget, not the planner's), with their ratio. On the CPU path
   the budget is engine.kv_cache_gb and the two must be equal.
2. profile/: `+profile=torch` on a replay of 32 requests (paged_kv, flash_attn, dynamic_batching,
   batched_decode; no CUDA graphs, so every op shows): profile_trace.json and profile_ops.md with each
   stage's top ops by self CPU and device time.
No Hydra and no MLflow: the GPU image has neither; the same dataclasses run.py builds are built here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from optladder.backends.engines import ReferenceBackend  # noqa: E402
from optladder.backends.profiling import ProfileConfig  # noqa: E402
from optladder.engine.config import EngineConfig, ModelConfig  # noqa: E402
from optladder.engine.loader import model_shape  # noqa: E402
from optladder.experiments.kv_plan import GIB, kv_budget, plan_kv  # noqa: E402
from optladder.traffic.replay_config import Pacing, ReplayConfig  # noqa: E402
from optladder.traffic.workload import WorkloadConfig, build_workload  # noqa: E402

LLAMA3_8B_SHAPE = dict(name="llama3_8b_shape", source="random", package=None, gguf_file=None, tokenizer="synthetic",
                       vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                       max_position_embeddings=8192, tie_word_embeddings=False)
TINY = dict(name="tiny", source="random", package=None, gguf_file=None, tokenizer="smollm2", vocab_size=49152,
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=16384,
            tie_word_embeddings=True, init_std=0.3)
OPTS = dict(paged_kv=True, flash_attn=True, dynamic_batching=True, batched_decode=True)


def plan_vs_engine(model: ModelConfig, cuda: bool, out: Path) -> ReferenceBackend:
    """Writes the comparison; returns the engine it built, for the profiled replay."""
    eng_cfg = EngineConfig(max_model_len=8192 if cuda else 1024, kv_cache_gb=None if cuda else 0.01,
                           kv_cache_memory_fraction=0.5, **OPTS)
    shape = model_shape(model)
    dtype = torch.bfloat16 if cuda else torch.float32
    gpu_gb = torch.cuda.get_device_properties(0).total_memory / GIB if cuda else None
    budget, rule = kv_budget(shape, dtype, eng_cfg.kv_cache_gb, eng_cfg.kv_cache_memory_fraction, gpu_gb)
    plan = plan_kv(shape, dtype, [dtype], [1024], eng_cfg.max_model_len, eng_cfg.block_size, budget, rule)
    planned = next(r for r in plan.rows if r.layout == "paged")
    backend = ReferenceBackend(model, eng_cfg)
    engine = backend.engine
    res = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "gpu_total_gib": gpu_gb,
           "model": model.name, "budget_rule": rule, "planned_budget_gib": budget,
           "planned_blocks": planned.num_blocks, "engine_blocks": engine.block_manager.num_blocks,
           "planned_bytes_per_token": planned.bytes_per_token, "engine_bytes_per_token": engine.bytes_per_token,
           "engine_kv_pool_gib": engine.kv_pool_bytes / GIB,
           "engine_over_plan": engine.block_manager.num_blocks / planned.num_blocks,
           "torch": torch.__version__}
    (out / "plan_vs_engine.json").write_text(json.dumps(res, indent=2))
    (out / "plan_vs_engine.md").write_text(
        "| device | budget rule | planned KV GiB | planned blocks | engine blocks | engine / plan |\n"
        "|---|---|---|---|---|---|\n"
        f"| {res['device']} | {rule} | {budget:.2f} | {planned.num_blocks:,} | {res['engine_blocks']:,} | "
        f"{res['engine_over_plan']:.3f} |\n")
    print(json.dumps(res, indent=2))
    return backend


def profiled_replay(backend: ReferenceBackend, out: Path) -> None:
    wl = WorkloadConfig(num_requests=32, rate=8.0)
    workload = build_workload(wl, backend.tokenizer, backend.max_model_len)
    backend.warmup(workload.requests[:2])
    prof = out / "profile"
    backend.profile_next_replay(ProfileConfig(steps=20), prof)
    t0 = time.perf_counter()
    records = backend.replay(workload.requests, ReplayConfig(progress=False), Pacing("open"), lambda r: None)
    summary = {"requests_ok": sum(r.ok for r in records), "replay_s": time.perf_counter() - t0,
               "profile": asdict(ProfileConfig(steps=20)), "stages": backend.engine.stage_metrics()}
    (prof / "summary.json").write_text(json.dumps(summary, indent=2))
    print((prof / "profile_ops.md").read_text()[:4000])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = args.device == "cuda"
    model = ModelConfig(**(LLAMA3_8B_SHAPE if cuda else TINY))
    backend = plan_vs_engine(model, cuda, args.out)
    profiled_replay(backend, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
