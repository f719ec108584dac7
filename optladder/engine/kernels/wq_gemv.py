"""Skinny products over quantized weights (M <= 64 rows), in Triton: out [M, N] = x [M, K] · (Q [N, K] · s)ᵀ
for the weight-only quantized layers of optladder/engine/quant.py, Q int8 or float8_e4m3fn, s one float32 scale a row.

At decode batch sizes a linear layer is a pass over its weights, so a weight of one byte an element halves
the bf16 step's bytes. One program streams a [BLOCK_N, K] slab of Q once, widens each tile in registers
(int8 codes and E4M3 values are exact in bf16 and float32), accumulates in float32 and multiplies by s once
at the end, rounding the output once, as optladder/engine/kernels/gemv.py does for dense weights. Two kernels:
- `_wq_kernel`: x · Qᵀ through tl.dot, the rows padded to M_PAD (16, 32 or 64);
- `_wq_row_kernel` (M = 1): no tensor-core tile at all, a multiply-add over [BLOCK_N, BLOCK_K] tiles and one
  sum at the end; 15 of the dot's 16 padded rows are wasted work, and the widening to the dot's dtype costs
  more instructions than the widening to float32.
On CUDA each kernel's tile shape is autotuned per layer shape (N, K, M_PAD) among CONFIGS / ROW_CONFIGS
(tiles whose K and N divide the layer's run without masks: the `EVEN` heuristic), and for M = 1 the faster of
the two tuned kernels is kept per (N, K); the first call of each shape (the warm-up before graph capture)
benchmarks them, and benchmarks/gpu_quant.py records the choice. On Triton's CPU interpreter (tests) one fixed
shape of each runs and the dot is in float32, since its bf16 dot is wrong there.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

MAX_M = 64


@triton.jit
def _wq_kernel(X, W, S, OUT, M, N, K, stride_xm, stride_wn, stride_om,
               M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, F32_DOT: tl.constexpr,
               EVEN: tl.constexpr):
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
        if EVEN:
            x = tl.load(x_ptr, mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptr)
            if F32_DOT:
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        else:
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


@triton.jit
def _wq_row_kernel(X, W, S, OUT, N, K, stride_wn,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    n_ok = n < N
    w_ptr = W + n[:, None].to(tl.int64) * stride_wn + k[None, :]
    acc = tl.full([BLOCK_N, BLOCK_K], 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN:
            x = tl.load(X + k0 + k).to(tl.float32)
            w = tl.load(w_ptr).to(tl.float32)
        else:
            k_ok = (k0 + k) < K
            x = tl.load(X + k0 + k, mask=k_ok, other=0.0).to(tl.float32)
            w_ok = n_ok[:, None] & k_ok[None, :]
            w = tl.where(w_ok, tl.load(w_ptr, mask=w_ok).to(tl.float32), 0.0)
        acc += w * x[None, :]
        w_ptr += BLOCK_K
    s = tl.load(S + n, mask=n_ok, other=0.0)
    tl.store(OUT + n, (tl.sum(acc, axis=1) * s).to(OUT.dtype.element_ty), mask=n_ok)


# BLOCK_N, BLOCK_K, warps, stages: the bf16 kernel's shapes with as many one-byte elements in flight, and more
CONFIGS = [(32, 256, 4, 4), (32, 512, 4, 3), (64, 256, 4, 4), (16, 512, 4, 4), (64, 512, 8, 3), (128, 256, 8, 3),
           (16, 1024, 4, 3), (32, 1024, 8, 3)]
ROW_CONFIGS = [(16, 256, 4, 4), (32, 256, 4, 4), (16, 512, 4, 4), (32, 512, 8, 3), (64, 256, 8, 3), (8, 1024, 4, 3),
               (16, 1024, 8, 3)]
_EVEN = {"EVEN": lambda a: a["K"] % a["BLOCK_K"] == 0 and a["N"] % a["BLOCK_N"] == 0}


@functools.cache
def autotuned():
    """The dot kernel autotuned over CONFIGS per (N, K, M_PAD), made on first use on CUDA only."""
    configs = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st) for bn, bk, w, st in CONFIGS]
    return triton.autotune(configs=configs, key=["N", "K", "M_PAD"])(triton.heuristics(_EVEN)(_wq_kernel))


@functools.cache
def autotuned_row():
    """The one-row kernel autotuned over ROW_CONFIGS per (N, K), made on first use on CUDA only."""
    configs = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st)
               for bn, bk, w, st in ROW_CONFIGS]
    return triton.autotune(configs=configs, key=["N", "K"])(triton.heuristics(_EVEN)(_wq_row_kernel))


_ROW_WINS: dict[tuple, bool] = {}  # (N, K, dtypes) -> whether the one-row kernel beat the dot kernel at M = 1


def _m_pad(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


def _dot(x, qweight, scales, out, m_pad: int | None = None) -> None:
    m, k = x.shape
    n = qweight.shape[0]
    args = (x, qweight, scales, out, m, n, k, x.stride(0), qweight.stride(0), out.stride(0))
    if x.is_cuda:
        autotuned()[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
            *args, M_PAD=m_pad or _m_pad(m), F32_DOT=x.dtype == torch.float32)
    else:
        block_k = min(256, max(16, triton.next_power_of_2(k)))
        _wq_kernel[(triton.cdiv(n, 32),)](*args, M_PAD=m_pad or _m_pad(m), BLOCK_N=32, BLOCK_K=block_k, F32_DOT=True,
                                          EVEN=k % block_k == 0 and n % 32 == 0, num_warps=4)


def _row(x, qweight, scales, out) -> None:
    n, k = qweight.shape
    if x.is_cuda:
        autotuned_row()[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](x, qweight, scales, out, n, k, qweight.stride(0))
    else:
        block_k = min(256, max(16, triton.next_power_of_2(k)))
        _wq_row_kernel[(triton.cdiv(n, 16),)](x, qweight, scales, out, n, k, qweight.stride(0), BLOCK_N=16,
                                              BLOCK_K=block_k, EVEN=k % block_k == 0 and n % 16 == 0, num_warps=4)


def _row_wins(x, qweight, scales, out) -> bool:
    """At M = 1 on CUDA: time both tuned kernels once per shape and keep the faster."""
    key = (*qweight.shape, qweight.dtype, x.dtype)
    if key not in _ROW_WINS:
        _row(x, qweight, scales, out)  # each autotunes on its first call
        _dot(x, qweight, scales, out)
        t_row = triton.testing.do_bench(lambda: _row(x, qweight, scales, out), warmup=10, rep=40)
        t_dot = triton.testing.do_bench(lambda: _dot(x, qweight, scales, out), warmup=10, rep=40)
        _ROW_WINS[key] = t_row < t_dot
    return _ROW_WINS[key]


def wq_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, kernel: str = "auto") -> torch.Tensor:
    """x [M, K] (M <= 64), qweight [N, K] int8 or float8_e4m3fn, scales [N] float32 -> [M, N] in x's dtype.
    kernel: auto (CUDA: the faster at M = 1, per shape; CPU: the one-row kernel at M = 1), row or dot."""
    m, k = x.shape
    n = qweight.shape[0]
    assert m <= MAX_M and qweight.shape[1] == k and scales.shape == (n,), (x.shape, qweight.shape, scales.shape)
    assert kernel in ("auto", "row", "dot") and (kernel != "row" or m == 1), (kernel, m)
    x = x.contiguous()
    assert qweight.stride(1) == 1
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 1 and (kernel == "row" or (kernel == "auto" and (not x.is_cuda or _row_wins(x, qweight, scales, out)))):
        _row(x, qweight, scales, out)
    else:
        _dot(x, qweight, scales, out)
    return out


def chosen_configs() -> dict[str, str]:
    """The autotuner's key (N, K, M_PAD and the arguments' dtypes) -> the tile shape it picked, and at M = 1
    which kernel won, for the record."""
    out: dict[str, str] = {}
    if autotuned.cache_info().currsize:
        out.update({f"dot {key}": str(cfg) for key, cfg in autotuned().cache.items()})  # key: N, K, M_PAD, dtypes
    if autotuned_row.cache_info().currsize:
        out.update({f"row {key}": str(cfg) for key, cfg in autotuned_row().cache.items()})
    out.update({f"M=1 {key[:2]} {key[2]}": "row" if won else "dot" for key, won in _ROW_WINS.items()})
    return out
