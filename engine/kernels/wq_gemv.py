"""Skinny products over quantized weights (M <= 16 rows), in Triton: out [M, N] = x [M, K] · (Q [N, K] · s)ᵀ
for the weight-only quantized layers of engine/quant.py, Q int8 or float8_e4m3fn, s one float32 scale a row.

At decode batch sizes a linear layer is a pass over its weights, so a weight of one byte an element halves
the bf16 step's bytes. One program streams a [BLOCK_N, K] slab of Q once, widens each tile to the
activations' dtype in registers (int8 codes and E4M3 values are exact in bf16), accumulates x · Qᵀ in
float32 and multiplies by s once at the end, rounding the output once, as engine/kernels/gemv.py does for
dense weights. A one-byte tile holds half the bytes of a bf16 one, so on CUDA the tile shape is autotuned
per layer shape (N, K) among a few that keep as many bytes in flight (benchmarks/gpu_quant.py records the
choice); the first call of each shape, the warm-up before graph capture, benchmarks them. On Triton's CPU
interpreter (tests) one fixed shape runs and the dot is in float32, since its bf16 dot is wrong there.
"""
from __future__ import annotations

import functools

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


CONFIGS = [(32, 256, 4), (32, 512, 3), (64, 256, 4), (16, 512, 4)]  # BLOCK_N, BLOCK_K, stages; 4 warps


@functools.cache
def autotuned():
    """The kernel autotuned over CONFIGS per (N, K), made on first use on CUDA only."""
    configs = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=4, num_stages=st) for bn, bk, st in CONFIGS]
    return triton.autotune(configs=configs, key=["N", "K"])(_wq_kernel)


def wq_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] (M <= 16), qweight [N, K] int8 or float8_e4m3fn, scales [N] float32 -> [M, N] in x's dtype."""
    m, k = x.shape
    n = qweight.shape[0]
    assert m <= MAX_M and qweight.shape[1] == k and scales.shape == (n,), (x.shape, qweight.shape, scales.shape)
    x = x.contiguous()
    assert qweight.stride(1) == 1
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    args = (x, qweight, scales, out, m, n, k, x.stride(0), qweight.stride(0), out.stride(0))
    if x.is_cuda:
        autotuned()[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
            *args, M_PAD=16, F32_DOT=x.dtype == torch.float32)
    else:
        block_k = min(256, max(16, triton.next_power_of_2(k)))
        _wq_kernel[(triton.cdiv(n, 32),)](*args, M_PAD=16, BLOCK_N=32, BLOCK_K=block_k, F32_DOT=True, num_warps=4)
    return out


def chosen_configs() -> dict[str, str]:
    """(N, K) -> the tile shape the autotuner picked, for the benchmark's record."""
    if not autotuned.cache_info().currsize:
        return {}
    return {str(key[:2]): str(cfg) for key, cfg in autotuned().cache.items()}
