"""Fused element-wise kernels for the graph-captured decode step (Triton).

Eager PyTorch runs a decoder layer's element-wise work as about 30 small kernels (RMSNorm alone is
seven); at batch 1 on an 8B model each is a few microseconds of almost no work, next to ~100 µs of
weight reads per layer. These three kernels bring the layer to 6 small kernels around its 4 GEMMs
(the two of attention included; 5 when optladder/engine/kernels/gemv.py folds SiLU·mul into the gate/up GEMM):
- add_rmsnorm: the residual add of the previous sub-layer fused into the next RMSNorm;
- rope_store_kv: rotary on q and k, k and v written to their cache slots, q written out, in one pass;
- silu_mul: SiLU(gate) · up.
Each rounds to the model dtype exactly where the eager module does (optladder/engine/model.py), so outputs agree
with eager up to the order of the float32 sum in RMSNorm. FMA contraction is off in these kernels:
with it the compiler narrows `round(a·b) + round(c·d)` to one bf16 FMA, which skips a rounding.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optladder.engine.kernels.reduce import row_sum


@triton.jit
def _add_rmsnorm_kernel(X, R, W, Y, R_OUT, eps, n_cols, stride_x, stride_r,
                        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)  # the eager `x + o` rounding
    tl.store(R_OUT + row * n_cols + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(row_sum(xf * xf, 0) / n_cols + eps)
    normed = (xf * inv).to(X.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * n_cols + cols, (w * normed).to(Y.dtype.element_ty), mask=ok)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(x + residual, or x) -> (RMSNorm of it, the sum as the new residual). x [T, hidden]."""
    t, n = x.shape
    y, r_out = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(n)
    r = residual if residual is not None else x
    _add_rmsnorm_kernel[(t,)](x, r, weight, y, r_out, eps, n, x.stride(0), r.stride(0),
                              HAS_RESIDUAL=residual is not None, BLOCK=block,
                              num_warps=min(16, max(1, block // 256)), enable_fp_fusion=False)
    return y, r_out


@triton.jit
def _rope_store_kernel(QKV, POS, COS, SIN, SLOT, Q_OUT, K_CACHE, V_CACHE, stride_qkv, stride_cos,
                       NH: tl.constexpr, NKV: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                       NH_PAD: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    hd: tl.constexpr = 2 * HALF
    pos = tl.load(POS + tok)
    slot = tl.load(SLOT + tok).to(tl.int64)
    i = tl.arange(0, HALF_PAD)
    i_ok = i < HALF
    dt = Q_OUT.dtype.element_ty
    # the eager path casts the float32 tables to the model dtype before multiplying
    cos = tl.load(COS + pos * stride_cos + i, mask=i_ok, other=0.0).to(dt).to(tl.float32)
    sin = tl.load(SIN + pos * stride_cos + i, mask=i_ok, other=0.0).to(dt).to(tl.float32)
    h = tl.arange(0, NH_PAD)
    base = QKV + tok * stride_qkv

    # q heads [NH, HALF] x2 halves; k heads follow them in the fused projection, then v
    q_ok = (h[:, None] < NH) & i_ok[None, :]
    q1 = tl.load(base + h[:, None] * hd + i[None, :], mask=q_ok, other=0.0).to(tl.float32)
    q2 = tl.load(base + h[:, None] * hd + HALF + i[None, :], mask=q_ok, other=0.0).to(tl.float32)
    # q*cos + rotate_half(q)*sin, rounding after each op as bf16/fp16 tensors do
    o1 = ((q1 * cos[None, :]).to(dt).to(tl.float32) + (-q2 * sin[None, :]).to(dt).to(tl.float32)).to(dt)
    o2 = ((q2 * cos[None, :]).to(dt).to(tl.float32) + (q1 * sin[None, :]).to(dt).to(tl.float32)).to(dt)
    q_dst = Q_OUT + tok * NH * hd + h[:, None] * hd + i[None, :]
    tl.store(q_dst, o1, mask=q_ok)
    tl.store(q_dst + HALF, o2, mask=q_ok)

    k_ok = (h[:, None] < NKV) & i_ok[None, :]
    kb = base + NH * hd + h[:, None] * hd + i[None, :]
    k1 = tl.load(kb, mask=k_ok, other=0.0).to(tl.float32)
    k2 = tl.load(kb + HALF, mask=k_ok, other=0.0).to(tl.float32)
    r1 = ((k1 * cos[None, :]).to(dt).to(tl.float32) + (-k2 * sin[None, :]).to(dt).to(tl.float32)).to(dt)
    r2 = ((k2 * cos[None, :]).to(dt).to(tl.float32) + (k1 * sin[None, :]).to(dt).to(tl.float32)).to(dt)
    c_dst = slot * NKV * hd + h[:, None] * hd + i[None, :]
    tl.store(K_CACHE + c_dst, r1, mask=k_ok)
    tl.store(K_CACHE + c_dst + HALF, r2, mask=k_ok)
    vb = kb + NKV * hd
    tl.store(V_CACHE + c_dst, tl.load(vb, mask=k_ok, other=0.0), mask=k_ok)
    tl.store(V_CACHE + c_dst + HALF, tl.load(vb + HALF, mask=k_ok, other=0.0), mask=k_ok)


def rope_store_kv(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """qkv [T, (NH + 2 NKV) · hd] -> rotated q [T, NH, hd]; rotated k and v stored at their slots."""
    t = qkv.shape[0]
    assert qkv.stride(1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous() and head_dim % 2 == 0
    q = torch.empty(t, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    half = head_dim // 2
    _rope_store_kernel[(t,)](qkv, positions, cos, sin, slot_mapping, q, k_cache, v_cache, qkv.stride(0),
                             cos.stride(0), NH=num_heads, NKV=num_kv_heads, HALF=half,
                             HALF_PAD=triton.next_power_of_2(half),
                             NH_PAD=triton.next_power_of_2(max(num_heads, num_kv_heads)), num_warps=4,
                             enable_fp_fusion=False)
    return q


@triton.jit
def _silu_mul_kernel(GU, OUT, n_cols, stride_gu, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(GU + row * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_gu + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    dt = OUT.dtype.element_ty
    act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)  # F.silu rounds to the dtype, then the product
    tl.store(OUT + row * n_cols + cols, (act * u).to(dt), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate first, as the fused projection writes it) -> SiLU(gate) · up [T, I]."""
    t, two_i = gate_up.shape
    n = two_i // 2
    out = torch.empty(t, n, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(t, triton.cdiv(n, block))](gate_up, out, n, gate_up.stride(0), BLOCK=block, num_warps=4,
                                                 enable_fp_fusion=False)
    return out
