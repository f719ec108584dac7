"""The KV and concurrency planner, before any run: how many sequences of this workload fit in KV memory,
contiguous against paged, the model's dtype against FP8 KV (optladder/experiments/kv_plan.py does the arithmetic).

    python -m optladder.experiments.plan model=llama3_8b_shape workload=azure_conv --gpu-gb 141
    python -m optladder.experiments.plan model=smollm2_135m engine.kv_cache_gb=0.3      (the budget a run would use)

Hydra overrides pick the model, the workload and the engine settings exactly as for run.py; --gpu-gb
plans for a GPU of that much memory (the engine's rule with engine.kv_cache_gb=null), and then
engine.dtype=auto means bfloat16, as on CUDA. Nothing is loaded but the tokenizer and the trace.
"""
from __future__ import annotations

import argparse
import sys

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from optladder.engine.loader import load_tokenizer, model_shape, resolve_device, resolve_dtype
from optladder.experiments.errors import PREFIX, USER_ERROR_EXIT, UserError, as_user_error
from optladder.experiments.kv_plan import kv_budget, plan_kv, plan_table
from optladder.experiments.schema import register
from optladder.paths import CONF_DIR
from optladder.traffic.workload import build_workload

UNCLIPPED = 1 << 30  # the workload's own lengths: the plan says how many exceed max_model_len, not clips them


def plan(overrides: list[str], gpu_gb: float | None) -> str:
    register()
    GlobalHydra.instance().clear()
    with as_user_error():
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            conf = OmegaConf.to_object(compose("config", overrides=overrides))
        eng = conf.engine
        shape = model_shape(conf.model)
        device = torch.device("cuda") if gpu_gb is not None else resolve_device(eng.device)
        dtype = resolve_dtype(eng.dtype, device)
        budget_gb, rule = kv_budget(shape, dtype, eng.kv_cache_gb, eng.kv_cache_memory_fraction, gpu_gb)
        workload = build_workload(conf.workload, load_tokenizer(conf.model), UNCLIPPED, conf.data.root)
    lens = [r.input_len + r.output_len for r in workload.requests]
    kv_dtypes = [dtype] + ([torch.float8_e4m3fn] if dtype != torch.float8_e4m3fn else [])
    p = plan_kv(shape, dtype, kv_dtypes, lens, eng.max_model_len, eng.block_size, budget_gb, rule)
    head = (f"model {conf.model.name}, workload {conf.workload.name} ({len(lens)} requests), "
            f"engine.max_model_len={eng.max_model_len}, engine.block_size={eng.block_size}")
    return head + "\n" + plan_table(p, eng.max_num_seqs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optladder.experiments.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu-gb", type=float, default=None, help="plan for a GPU with this much memory (GiB)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for run.py: model=... workload=...")
    args = parser.parse_args(argv)
    try:
        print(plan(args.overrides, args.gpu_gb))
    except UserError as e:
        print(PREFIX + str(e), file=sys.stderr)
        return USER_ERROR_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
