"""Float64 references for the attention kernels, written for clarity over speed: the CPU tests and the
GPU correctness checks (benchmarks/gpu_bench.py) compare the kernels against these. No Triton here."""
from __future__ import annotations

import torch


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """q [n, H, D], k/v [L, KVH, D] -> float64 [n, H, D]; the queries are the last n positions."""
    h, kvh, d = q.shape[1], k.shape[1], q.shape[2]
    q, k, v = q.double(), k.double(), v.double()
    k, v = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) / d ** 0.5
    if causal:
        n, length = q.shape[0], k.shape[0]
        future = torch.ones(n, length, dtype=torch.bool, device=q.device).triu(length - n + 1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)


def paged_decode_reference(q, k_cache, v_cache, block_tables, context_lens) -> torch.Tensor:
    """The paged decode kernel's contract in float64: q [B, H, D] over each sequence's cached context.
    A sequence with an empty context gets zeros."""
    block_size = k_cache.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for b, n in enumerate(context_lens.tolist()):
        if n == 0:
            continue
        pos = torch.arange(n, device=q.device)
        blocks = block_tables[b, pos // block_size].long()
        k, v = k_cache[blocks, pos % block_size], v_cache[blocks, pos % block_size]
        out[b] = attention_reference(q[b:b + 1], k, v, causal=False)[0]
    return out


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN or inf anywhere in out gives inf, so it never passes."""
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out.double() - ref).norm() / ref.norm()).item()


def paged_prefill_reference(q, k_cache, v_cache, block_tables, query_lens: list[int],
                            context_lens: list[int]) -> torch.Tensor:
    """The varlen kernel's contract in float64: sequence b's q_len queries are the last positions of its
    context and attend causally to it, read from the cache through its block table."""
    block_size = k_cache.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    start = 0
    for b, (n, ctx) in enumerate(zip(query_lens, context_lens)):
        pos = torch.arange(ctx, device=q.device)
        blocks = block_tables[b, pos // block_size].long()
        k, v = k_cache[blocks, pos % block_size], v_cache[blocks, pos % block_size]
        out[start:start + n] = attention_reference(q[start:start + n], k, v, causal=True)
        start += n
    return out
