"""Skinny products over quantized weights (M <= 16 rows), in Triton: out [M, N] = x [M, K] · (Q [N, K] · s)ᵀ
for the weight-only quantized layers of engine/quant.py, Q int8 or float8_e4m3fn, s one float32 scale a row.

At decode batch sizes a linear layer is a pass over its weights, so a weight of one byte an element halves
the bf16 step's bytes. One program streams a [BLOCK_N, K] slab of Q once, widens each tile to the
activations' dtype in registers (int8 codes and E4M3 values are exact in bf16), accumulates x · Qᵀ in
float32 and multiplies by s once at the end, rounding the output once, as engine/kernels/gemv.py does for
dense weights. On Triton's CPU interpreter (tests) the dot runs in float32, whose bf16 dot is wrong there.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_M = 16


@triton.jit
def _wq_kernel(X, W, S, OUT, M, N, K, stride_xm, stride_wn, stride_om,
               M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, F32_DOT: tl.constexpr):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, M_PAD)
    k = tl.arange(0, BLOCK_K)
    n_ok = n < N
    m_ok = m < M
    x_ptr = X + m[:, None] * stride_xm + k[None, :]
    w_ptr = W + n[:, None].to(tl.int64) * stride_wn + k[None, :]
    acc = tl.full([M_PAD, BLOCK_N], 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + k) < K
        x = tl.load(x_ptr, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_ok = n_ok[:, None] & k_ok[None, :]
        # no `other=` for the weight: Triton cannot cast a constant to fp8; masked lanes are zeroed once widened
        w = tl.load(w_ptr, mask=w_ok)
        if F32_DOT:
            w = tl.where(w_ok, w.to(tl.float32), 0.0)
            acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:
            w = tl.where(w_ok, w.to(x.dtype), 0.0)
            acc += tl.dot(x, tl.trans(w))
        x_ptr += BLOCK_K
        w_ptr += BLOCK_K
    s = tl.load(S + n, mask=n_ok, other=0.0)
    out = acc * s[None, :]
    tl.store(OUT + m[:, None] * stride_om + n[None, :], out.to(OUT.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def wq_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
              block_n: int = 32, block_k: int = 256) -> torch.Tensor:
    """x [M, K] (M <= 16), qweight [N, K] int8 or float8_e4m3fn, scales [N] float32 -> [M, N] in x's dtype."""
    m, k = x.shape
    n = qweight.shape[0]
    assert m <= MAX_M and qweight.shape[1] == k and scales.shape == (n,), (x.shape, qweight.shape, scales.shape)
    x = x.contiguous()
    assert qweight.stride(1) == 1
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    _wq_kernel[(triton.cdiv(n, block_n),)](
        x, qweight, scales, out, m, n, k, x.stride(0), qweight.stride(0), out.stride(0),
        M_PAD=16, BLOCK_N=block_n, BLOCK_K=block_k,
        F32_DOT=x.dtype == torch.float32 or not x.is_cuda, num_warps=4, num_stages=4)
    return out
