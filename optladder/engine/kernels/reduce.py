"""Row reductions for the kernels: tl.sum and tl.max, spelt as tl.reduce over their own combine functions.

tl.sum and tl.max are jit'd functions, jit'd when Triton is imported: if anything imported Triton before
TRITON_INTERPRET=1 was set (transformers does), the CPU interpreter cannot call them. These wrappers are
jit'd when the kernels are imported, and pass tl.reduce the very combine functions tl.sum and tl.max use,
which the interpreter recognises and runs as numpy reductions. On the GPU the code is the same as theirs.
"""
import triton
import triton.language as tl


@triton.jit
def row_sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._sum_combine)


@triton.jit
def row_max(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._elementwise_max)
