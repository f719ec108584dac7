"""Skinny matrix products for decode (M <= 16 rows), in Triton: out [M, N] = x [M, K] · W [N, K]ᵀ.

At decode batch sizes a linear layer is a pass over its weights; cuBLAS's kernels for Llama-3-8B's
shapes at M = 1 reached 2.5 to 3.9 TB/s on an H200 (copy: 4.3), and add a split-K reduction kernel for
two of them; this kernel reached 2.9 to 4.1 (benchmarks/results/gpu_h200.md). One program here streams a
[BLOCK_N, K] slab of W once, accumulating in float32, and writes its outputs rounded once, as cuBLAS
does. `silu_mul=True` reads the fused gate/up weight [2I, K] and writes SiLU(gate) · up [M, I] directly,
rounding gate and up first, as the eager path does (optladder/engine/model.py), so the separate kernel goes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_M = 16


@triton.jit
def _skinny_kernel(X, W, OUT, M, N, K, half_n, stride_xm, stride_wn, stride_om,
                   M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN_K: tl.constexpr, SILU_MUL: tl.constexpr):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, M_PAD)
    k = tl.arange(0, BLOCK_K)
    n_ok = n < N
    m_ok = m < M
    x_ptr = X + m[:, None] * stride_xm + k[None, :]
    w_ptr = W + n[:, None].to(tl.int64) * stride_wn + k[None, :]
    acc = tl.full([M_PAD, BLOCK_N], 0.0, tl.float32)
    if SILU_MUL:
        u_ptr = w_ptr + half_n.to(tl.int64) * stride_wn
        acc_u = tl.full([M_PAD, BLOCK_N], 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptr, mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptr, mask=n_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + k) < K
            x = tl.load(x_ptr, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w))
        if SILU_MUL:
            if EVEN_K:
                u = tl.load(u_ptr, mask=n_ok[:, None], other=0.0)
            else:
                u = tl.load(u_ptr, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            acc_u += tl.dot(x, tl.trans(u))
            u_ptr += BLOCK_K
        x_ptr += BLOCK_K
        w_ptr += BLOCK_K
    dt = OUT.dtype.element_ty
    if SILU_MUL:  # round gate and up as the bf16 projection would, then SiLU, then the product
        g = acc.to(dt).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        acc = act * acc_u.to(dt).to(tl.float32)
    tl.store(OUT + m[:, None] * stride_om + n[None, :], acc.to(dt), mask=m_ok[:, None] & n_ok[None, :])


def _config(silu_mul: bool) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages). A sweep of 36 configs on the H200 over Llama-3-8B's five
    decode shapes found this one within 3% of the best for each at M = 1 (benchmarks/results/gpu_h200.md);
    silu_mul streams two slabs, so one pipeline stage fewer fits shared memory."""
    return (32, 256, 4, 3) if silu_mul else (32, 256, 4, 4)


def decode_linear(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False) -> torch.Tensor:
    """A linear layer of the fused decode step: this kernel for up to 16 rows in bf16/fp16 on CUDA,
    cuBLAS (and the fused SiLU·mul kernel) otherwise."""
    if x.shape[0] <= MAX_M and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        return skinny_linear(x, weight, silu_mul)
    out = torch.nn.functional.linear(x, weight)
    if not silu_mul:
        return out
    from optladder.engine.kernels.fused import silu_mul as silu_mul_kernel

    return silu_mul_kernel(out)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False,
                  config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x [M, K] (M <= 16), weight [N, K] -> [M, N], or [M, N/2] with silu_mul."""
    m, k = x.shape
    n = weight.shape[0]
    assert m <= MAX_M and weight.shape[1] == k and x.stride(1) == 1 and weight.stride(1) == 1
    n_out = n // 2 if silu_mul else n
    out = torch.empty(m, n_out, dtype=x.dtype, device=x.device)
    block_n, block_k, warps, stages = config or _config(silu_mul)
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    _skinny_kernel[(triton.cdiv(n_out, block_n),)](
        x, weight, out, m, n_out, k, n_out, x.stride(0), weight.stride(0), out.stride(0),
        M_PAD=16, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0, SILU_MUL=silu_mul,
        num_warps=warps, num_stages=stages)
    return out
