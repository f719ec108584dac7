"""Decode attention over the paged KV cache, in Triton: one query token per sequence.

q [B, H, D], k_cache/v_cache [num_blocks, block_size, KVH, D], block_tables [B, max_blocks] int32,
context_lens [B] (tokens in the cache, the new one included) -> out [B, H, D].

- GQA: one program serves one KV head and its whole query group (H // KVH heads), so each K/V tile is
  read once for the group; the group is padded to 16 rows for the tensor-core dot.
- online softmax in float32 (base 2), probabilities cast to the cache dtype for the ·V dot, as flash does.
- split-K (flash-decoding): the context is cut into ranges (see `num_splits`: enough programs for the
  multiprocessors, one program a sequence being too few loads in flight whatever the batch), each range reduced
  to (m, l, acc) partials, then merged by a second kernel; a range past its sequence's context (a short context
  among long table widths) writes only its (m, l), and the merge reads no partial of it.
- The same row gives the same bits eagerly and under graph replay: a replay runs the batch's graph bucket (a
  power of two) with tables as wide as max_model_len, an eager step the batch itself with tables as wide as its
  longest context. So nothing a row's result depends on follows either: the split count follows the batch
  rounded up to a power of two, a row's ranges follow that count and its own context, the merge's reduction
  width follows that count too; the table's width only trims programs whose ranges would all be empty
  (a cuda_graphs rung is then lossless against its eager control: 2026-12-02, a SmolLM2 ladder on the H200
  found 81.5% equal answers when the width set the split count).
- kv_fp8 (optladder/engine/kv_quant.py): E4M3 K/V tiles are widened in registers, the keys' per-token scales multiply
  the scores and the values' scales the probabilities, so the cache is read at one byte an element.
- CUDA-graph capturable: no host sync; the split count depends only on the shapes (batch and heads; the
  table's width × block_size, the longest context it can hold, trims the grid), context_lens is read on the
  device. The contiguous cache is the case block_size = max_model_len with tables of width 1.
Head dims: multiples of 8 up to 256 (optladder/engine/validation.py refuses the others before anything loads).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from optladder.engine.kernels.reduce import row_max, row_sum

MAX_HEAD_DIM = 256
MAX_SPLITS = 32
# programs (sequence x KV head x split) a multiprocessor should get: one program a (sequence, head) is a single
# pass over a long context with four warps, too few loads in flight to reach the copy rate; at most SPREAD_SPLITS
# splits for it
PROGRAMS_PER_SM, SPREAD_SPLITS = 96, 12


def head_dim_supported(head_dim: int) -> bool:
    return 8 <= head_dim <= MAX_HEAD_DIM and head_dim % 8 == 0


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int | None) -> int:
    if device_index is None:  # CPU tensors: Triton's interpreter
        return 8
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_splits(batch: int, kv_heads: int, num_sms: int) -> int:
    """Ranges per (sequence, KV head), from the batch rounded up to a power of two (the graph bucket it replays
    in: so a row is split the same eagerly and in a graph), at most MAX_SPLITS: the larger of two counts, enough
    programs for two waves of the multiprocessors (the rule until 2026-12-02, which decides batches of 1 and 2:
    not re-measured), and about PROGRAMS_PER_SM programs a multiprocessor, at most SPREAD_SPLITS. Measured on the
    H200 under graph replay (benchmarks/results/gpu_decode_splits_h200.md, Llama-3-8B's attention, the Azure
    trace's contexts): with one split a (sequence, head), the old count from batch 17 up, K/V was read at
    536-2,937 GB/s at batches 17-192; with 8-12 splits at 1,853-3,364 GB/s, one layer 1.15-3.8x faster."""
    programs = triton.next_power_of_2(max(1, batch)) * kv_heads
    fill = triton.cdiv(2 * num_sms, programs) if programs < num_sms else 1
    spread = min(triton.cdiv(PROGRAMS_PER_SM * num_sms, programs), SPREAD_SPLITS)
    return max(1, min(max(fill, spread), MAX_SPLITS))


def grid_splits(splits: int, max_len: int, block_n: int) -> int:
    """Programs launched per (sequence, KV head) for `splits` ranges: ranges are whole tiles of block_n tokens,
    so a table that holds max_len tokens has at most cdiv(max_len, block_n) ranges that are not empty."""
    return max(1, min(splits, triton.cdiv(max_len, block_n)))


# the split count and the block table's width change with the batch in eager decode steps: no
# specialization on them, so no compile in the middle of a replay (graph replay fixes both anyway)
@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _split_kernel(Q, K, V, BT, CTX, O, M, L, KS, VS,
                  sm_scale, num_splits,  # the ranges a context is cut into; the grid may launch fewer (all empty)
                  stride_qb, stride_qh, stride_kn, stride_ks, stride_kh, stride_bt,
                  stride_ob, stride_oh, stride_os, stride_sn, stride_ss,
                  BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
                  D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                  DIRECT: tl.constexpr, F32_DOT: tl.constexpr, KV_FP8: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CTX + b).to(tl.int32)
    per_split = ((ctx + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    g_ok = g < GROUP
    d_ok = d < D
    head = kvh * GROUP + g
    q = tl.load(Q + b * stride_qb + head[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    if F32_DOT:
        q = q.to(tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # softmax in base 2

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.full([G_PAD], 0.0, tl.float32)
    acc = tl.full([G_PAD, D_PAD], 0.0, tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < end
        block = tl.load(BT + b * stride_bt + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        off = block * stride_kn + (pos % BLOCK_SIZE).to(tl.int64) * stride_ks + kvh * stride_kh
        kv_mask = ok[:, None] & d_ok[None, :]
        if KV_FP8:  # no `other=` (Triton cannot cast a constant to fp8): masked lanes are zeroed once widened
            s_off = block * stride_sn + (pos % BLOCK_SIZE).to(tl.int64) * stride_ss + kvh
            k = tl.load(K + off[:, None] + d[None, :], mask=kv_mask)
            k = tl.where(kv_mask, k.to(tl.float32), 0.0).to(tl.float32 if F32_DOT else Q.dtype.element_ty)
        else:
            k = tl.load(K + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if F32_DOT:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if KV_FP8:
            s = s * tl.load(KS + s_off, mask=ok, other=0.0).to(tl.float32)[None, :]
        s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, row_max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + row_sum(p, 1)
        if KV_FP8:
            v = tl.load(V + off[:, None] + d[None, :], mask=kv_mask)
            v = tl.where(kv_mask, v.to(tl.float32), 0.0).to(tl.float32 if F32_DOT else Q.dtype.element_ty)
            p_v = p * tl.load(VS + s_off, mask=ok, other=0.0).to(tl.float32)[None, :]  # V's scales, on p
        else:
            v = tl.load(V + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
            p_v = p
        if F32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p_v, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p_v.to(v.dtype), v)
        m_i = m_new

    o_ptr = O + b * stride_ob + head[:, None] * stride_oh + d[None, :]
    if DIRECT:  # one split: normalise and write the output; an empty context gives zeros, never NaN
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr, out.to(O.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    else:  # an empty range (past the context) writes no partial: the merge does not read it
        g_live = g < GROUP * (end > start).to(tl.int32)  # all of the group, or none for an empty range
        tl.store(o_ptr + split * stride_os, acc, mask=g_live[:, None] & d_ok[None, :])
        ml_off = (b * tl.num_programs(1) * GROUP + head) * tl.num_programs(2) + split  # M, L: [B, H, grid]
        tl.store(M + ml_off, m_i, mask=g_ok)
        tl.store(L + ml_off, l_i, mask=g_ok)


@triton.jit(do_not_specialize=["grid"])
def _reduce_kernel(O_PART, M, L, OUT, grid,  # the split kernel's programs a (sequence, head); S_PAD: the ranges'
                   stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
                   S_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    s_ok = s < grid
    ml_off = (b * tl.num_programs(1) + h) * grid + s
    m = tl.load(M + ml_off, mask=s_ok, other=float("-inf"))
    l = tl.load(L + ml_off, mask=s_ok, other=0.0)
    m_max = row_max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # every split empty: weights 0, output 0
    w = tl.exp2(m - m_max)
    denom = row_sum(w * l, 0)
    live = s_ok & (m > float("-inf"))  # an empty range wrote no partial (its weight is 0 anyway)
    part = tl.load(O_PART + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + d[None, :],
                   mask=live[:, None] & (d[None, :] < D), other=0.0)
    out = row_sum(part * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
    tl.store(OUT + b * stride_ob + h * stride_oh + d, out.to(OUT.dtype.element_ty), mask=d < D)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           out: torch.Tensor | None = None, splits: int | None = None) -> torch.Tensor:
    """Attention of one new query token per sequence over its cached context; see the module docstring.
    `out` may be given (e.g. poisoned, in tests); `splits` overrides the split heuristic (the ranges a context
    is cut into; a table too narrow for that many launches fewer programs, see grid_splits). k_cache and
    v_cache are tensors, or kv_fp8's QuantKVs (E4M3 values and per-token scales)."""
    fp8 = not isinstance(k_cache, torch.Tensor)
    k_scale = v_scale = None
    if fp8:
        k_cache, k_scale, v_cache, v_scale = k_cache.data, k_cache.scale, v_cache.data, v_cache.scale
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    assert heads % kv_heads == 0 and head_dim_supported(head_dim), (heads, kv_heads, head_dim)
    assert k_cache.stride(-1) == 1 and v_cache.stride() == k_cache.stride() and q.stride(-1) == 1
    group = heads // kv_heads
    if out is None:
        out = torch.empty_like(q)
    if splits is None:
        dev = q.device.index if q.is_cuda else None
        splits = num_splits(batch, kv_heads, _num_sms(dev))
    d_pad = max(16, triton.next_power_of_2(head_dim))
    block_n = 64 if d_pad <= 128 else 32
    grid = grid_splits(splits, block_tables.shape[1] * block_size, block_n)
    common = dict(BLOCK_SIZE=block_size, GROUP=group, G_PAD=max(16, triton.next_power_of_2(group)),
                  D=head_dim, D_PAD=d_pad, BLOCK_N=block_n,
                  # float32 inputs, and Triton's CPU interpreter (whose bf16 dot is wrong), dot in exact fp32
                  F32_DOT=q.dtype == torch.float32 or not q.is_cuda,
                  num_warps=4, num_stages=2)
    args = (q, k_cache, v_cache, block_tables, context_lens)
    scales = (k_scale, v_scale) if fp8 else (q, q)  # unused without fp8: any pointer
    scale_strides = (k_scale.stride(0), k_scale.stride(1)) if fp8 else (0, 0)
    common["KV_FP8"] = fp8
    strides = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
               block_tables.stride(0))
    scale = head_dim ** -0.5
    if grid == 1:  # one range holds every context: the same bits as a merge of one live range
        _split_kernel[(batch, kv_heads, 1)](*args, out, out, out, *scales, scale, 1, *strides,
                                            out.stride(0), out.stride(1), 0, *scale_strides, DIRECT=True, **common)
        return out
    part = torch.empty(batch, heads, grid, head_dim, dtype=torch.float32, device=q.device)
    m = torch.empty(batch, heads, grid, dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    _split_kernel[(batch, kv_heads, grid)](*args, part, m, l_sum, *scales, scale, splits, *strides,
                                           part.stride(0), part.stride(1), part.stride(2), *scale_strides,
                                           DIRECT=False, **common)
    _reduce_kernel[(batch, heads)](part, m, l_sum, out, grid, part.stride(0), part.stride(1),
                                   part.stride(2), out.stride(0), out.stride(1),
                                   S_PAD=max(2, triton.next_power_of_2(splits)), D=head_dim, D_PAD=d_pad,
                                   num_warps=4)
    return out
