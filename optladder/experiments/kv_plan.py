"""How many sequences fit in KV memory: the seed campaign's first calculation, from the engine's own numbers.

KV bytes per token come from the model's shape and the KV dtype (engine.model_runner.kv_bytes_per_token);
the KV budget is engine.kv_cache_gb when set, else, as the engine does on a GPU, kv_cache_memory_fraction
of the memory left after the weights; the pool holds budget // (block_size x bytes per token) blocks.
Contiguous KV (paged_kv off) gives every admitted sequence one block of max_model_len slots, so the
concurrency is the block count whatever the lengths; paged KV gives a sequence of L tokens ceil(L /
block_size) blocks, so it depends on the workload's lengths (taken at their peak: input + output).
tests/test_plan.py holds these numbers against a real engine's block manager.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from optladder.engine.model import LlamaShape
from optladder.engine.model_runner import kv_bytes_per_token

GIB = float(1 << 30)
PERCENTILES = (50, 90, 99)


@dataclass
class KVRow:
    kv_dtype: str
    bytes_per_token: int
    layout: str  # contiguous | paged
    block_size: int
    num_blocks: int
    kv_tokens: int  # slots in the pool
    concurrency: dict[int, int]  # percentile of input + output -> sequences the pool admits at that length


@dataclass
class KVPlan:
    num_params: int
    weight_dtype: str
    weights_gb: float
    budget_gb: float
    budget_rule: str  # how the budget was set
    lengths: dict[int, int]  # percentile -> input + output tokens
    over_max_len: float  # share of requests longer than max_model_len
    rows: list[KVRow]


def num_blocks(budget_bytes: int, block_size: int, bytes_per_token: int) -> int:
    return budget_bytes // (block_size * bytes_per_token)


def concurrency(blocks: int, block_size: int, length: int) -> int:
    """Sequences of `length` tokens a pool of `blocks` blocks of `block_size` holds at once."""
    return blocks // max(1, math.ceil(length / block_size))


def kv_budget(shape: LlamaShape, weight_dtype: torch.dtype, kv_cache_gb: float | None, fraction: float,
              gpu_gb: float | None) -> tuple[float, str]:
    """(KV budget in GiB, how it was set). gpu_gb wins over kv_cache_gb: a question about a given GPU."""
    if gpu_gb is not None:
        free = gpu_gb - weights_gb(shape, weight_dtype)
        if free <= 0:
            raise ValueError(f"the weights ({weights_gb(shape, weight_dtype):.1f} GiB) do not fit in {gpu_gb} GiB")
        return free * fraction, (f"{fraction:g} x ({gpu_gb:g} GiB - weights), as the engine sizes it with "
                                 f"engine.kv_cache_gb=null; CUDA context and activations come out of this too")
    if kv_cache_gb is None:
        raise ValueError("engine.kv_cache_gb=null sizes KV from free device memory: give --gpu-gb to plan it")
    return kv_cache_gb, f"engine.kv_cache_gb={kv_cache_gb:g}"


def weights_gb(shape: LlamaShape, dtype: torch.dtype) -> float:
    return shape.num_params * torch.finfo(dtype).bits / 8 / GIB


def plan_kv(shape: LlamaShape, weight_dtype: torch.dtype, kv_dtypes: list[torch.dtype], seq_lens: list[int],
            max_model_len: int, block_size: int, budget_gb: float, budget_rule: str) -> KVPlan:
    lengths = {p: int(math.ceil(np.percentile(seq_lens, p))) for p in PERCENTILES}
    budget = int(budget_gb * GIB)
    rows = []
    for kv_dtype in kv_dtypes:
        bpt = kv_bytes_per_token(shape, kv_dtype)
        for layout, bs in (("contiguous", max_model_len), ("paged", block_size)):
            blocks = num_blocks(budget, bs, bpt)
            conc = {p: concurrency(blocks, bs, min(n, max_model_len)) for p, n in lengths.items()}
            rows.append(KVRow(str(kv_dtype).replace("torch.", ""), bpt, layout, bs, blocks, blocks * bs, conc))
    over = float(np.mean([n > max_model_len for n in seq_lens]))
    return KVPlan(shape.num_params, str(weight_dtype).replace("torch.", ""), weights_gb(shape, weight_dtype),
                  budget_gb, budget_rule, lengths, over, rows)


def plan_table(plan: KVPlan, max_num_seqs: int) -> str:
    lines = [f"weights: {plan.num_params / 1e9:.3g} B parameters in {plan.weight_dtype}: {plan.weights_gb:.2f} GiB",
             f"KV budget: {plan.budget_gb:.2f} GiB ({plan.budget_rule})",
             "sequence length (input + output): " + ", ".join(f"p{p} {n}" for p, n in plan.lengths.items())
             + (f"; {plan.over_max_len:.0%} exceed max_model_len" if plan.over_max_len else ""), "",
             "| KV dtype | bytes/token | layout | blocks x tokens | KV tokens | "
             + " | ".join(f"sequences at p{p}" for p in PERCENTILES) + " |",
             "|---|---|---|---|---|" + "---|" * len(PERCENTILES)]
    for r in plan.rows:
        conc = " | ".join(str(r.concurrency[p]) for p in PERCENTILES)
        lines.append(f"| {r.kv_dtype} | {r.bytes_per_token:,} | {r.layout} | {r.num_blocks:,} x {r.block_size} | "
                     f"{r.kv_tokens:,} | {conc} |")
    lines += ["", f"The scheduler admits at most engine.max_num_seqs={max_num_seqs} at once (continuous batching); "
              "contiguous KV reserves max_model_len slots per sequence whatever its length."]
    return "\n".join(lines)
