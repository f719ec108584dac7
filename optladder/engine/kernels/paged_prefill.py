"""Attention of a mixed step over the paged KV cache, in Triton, in one launch: variable-length queries.

Every sequence of a step brings `q_len` new tokens, the last `q_len` positions of its context of `ctx`
tokens (a whole prompt, a chunk of a prompt whose earlier chunks are already cached, or one decode token);
their K/V are already in the cache (the layer stores them first). Each query attends to its sequence's
cached context up to its own position: causal within the chunk, everything before it.

q [T, H, D] (the step's tokens, sequence after sequence), k_cache/v_cache [num_blocks, block_size, KVH, D],
block_tables [B, max_blocks] int32, query_start [B + 1] (cumulative q_len), context_lens [B] -> out [T, H, D].

- One program serves a tile of BLOCK_Q consecutive queries of one sequence and one KV head with its whole
  query group: BLOCK_Q × GROUP rows share each K/V tile read, so GQA reads the cache once per group.
- The tiles are listed on the host (`tiles`: sequence index and first query of each), so a step of one
  4,096-token chunk and two hundred decode rows is one launch of 256 + 200 tiles per KV head.
- A tile reads keys only up to its last query's position (the causal bound), so a chunk costs the triangle.
- Online softmax in float32 (base 2), probabilities cast to the cache dtype for the ·V dot, as flash does.
- kv_fp8 (optladder/engine/kv_quant.py): E4M3 tiles widened in registers, the per-token scales of K on the scores and
  of V on the probabilities, as in the decode kernel.
Head dims: multiples of 8 up to 256, as the decode kernel (optladder/engine/validation.py refuses the others).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optladder.engine.kernels.paged_decode import head_dim_supported
from optladder.engine.kernels.reduce import row_max, row_sum

BLOCK_M = 64  # rows a program holds: BLOCK_Q queries × the padded query group
BLOCK_N = 64  # keys a loop iteration reads


# the block table's width changes from step to step: specializing on it (divisible by 16 or not) would
# compile the kernel again in the middle of a replay, a stall of a second or more
@triton.jit(do_not_specialize=["stride_bt"])
def _varlen_kernel(Q, K, V, O, BT, QSTART, CTX, TILE_SEQ, TILE_Q0, KS, VS, sm_scale,
                   stride_qt, stride_qh, stride_kn, stride_ks, stride_kh, stride_bt, stride_ot, stride_oh,
                   stride_sn, stride_ss,
                   BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
                   D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, F32_DOT: tl.constexpr,
                   KV_FP8: tl.constexpr):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.load(TILE_SEQ + tile)
    q0 = tl.load(TILE_Q0 + tile)
    q_start = tl.load(QSTART + b)
    q_len = tl.load(QSTART + b + 1) - q_start
    ctx = tl.load(CTX + b)

    r = tl.arange(0, BLOCK_Q * G_PAD)
    qi = q0 + r // G_PAD  # the query's index within its sequence's chunk
    g = r % G_PAD
    row_ok = (qi < q_len) & (g < GROUP)
    q_pos = ctx - q_len + qi  # its position in the sequence
    head = kvh * GROUP + g
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    tok = (q_start + qi).to(tl.int64)
    q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if F32_DOT:
        q = q.to(tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # softmax in base 2

    m_i = tl.full([BLOCK_Q * G_PAD], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_Q * G_PAD], 0.0, tl.float32)
    acc = tl.full([BLOCK_Q * G_PAD, D_PAD], 0.0, tl.float32)
    end = tl.minimum(ctx - q_len + q0 + BLOCK_Q, ctx)  # keys past the tile's last query are never needed
    for n0 in range(0, end, BLOCK_N):
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
        # key 0 is in every row's range and in the first tile, so no row's maximum stays -inf
        s = tl.where(ok[None, :] & (pos[None, :] <= q_pos[:, None]), s * qk_scale, float("-inf"))
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
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def group_pad(heads: int, kv_heads: int) -> int:
    return triton.next_power_of_2(heads // kv_heads)


def block_q(heads: int, kv_heads: int) -> int:
    """Queries per tile: the rows a program holds divided by the padded query group (at least 1)."""
    return max(1, BLOCK_M // group_pad(heads, kv_heads))


def tile_list(query_lens: list[int], per_tile: int) -> tuple[list[int], list[int]]:
    """(sequence index, first query) of every tile of the step, on the host, from the query lengths."""
    seq, first = [], []
    for i, n in enumerate(query_lens):
        for q0 in range(0, n, per_tile):
            seq.append(i)
            first.append(q0)
    return seq, first


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start: torch.Tensor, context_lens: torch.Tensor,
                            tiles, out: torch.Tensor | None = None) -> torch.Tensor:
    """See the module docstring. tiles: the two int32 rows of `tile_list` (sequence index, first query), on
    q's device, each best 16-byte aligned (optladder/engine/attention.py's `packed`);
    `out` may be given (e.g. poisoned, in tests). k_cache and v_cache are tensors, or kv_fp8's QuantKVs."""
    fp8 = not isinstance(k_cache, torch.Tensor)
    scales, scale_strides = (q, q), (0, 0)  # unused without fp8: any pointer
    if fp8:
        scales, scale_strides = (k_cache.scale, v_cache.scale), (k_cache.scale.stride(0), k_cache.scale.stride(1))
        k_cache, v_cache = k_cache.data, v_cache.data
    num_tokens, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    assert heads % kv_heads == 0 and head_dim_supported(head_dim), (heads, kv_heads, head_dim)
    assert k_cache.stride(-1) == 1 and v_cache.stride() == k_cache.stride() and q.stride(-1) == 1
    if out is None:
        out = torch.empty_like(q)
    num_tiles = tiles[0].shape[0]
    if num_tiles == 0:
        return out
    d_pad = max(16, triton.next_power_of_2(head_dim))
    _varlen_kernel[(num_tiles, kv_heads)](
        q, k_cache, v_cache, out, block_tables, query_start, context_lens, tiles[0], tiles[1], *scales,
        head_dim ** -0.5,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), *scale_strides,
        BLOCK_SIZE=block_size, GROUP=heads // kv_heads, G_PAD=group_pad(heads, kv_heads),
        BLOCK_Q=block_q(heads, kv_heads), D=head_dim, D_PAD=d_pad,
        BLOCK_N=BLOCK_N if d_pad <= 128 else 32,
        # float32 inputs, and Triton's CPU interpreter (whose bf16 dot is wrong), dot in exact fp32
        F32_DOT=q.dtype == torch.float32 or not q.is_cuda, KV_FP8=fp8,
        num_warps=4, num_stages=2)
    return out
