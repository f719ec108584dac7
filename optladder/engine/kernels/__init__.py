"""The project's own GPU kernels, in Triton: paged decode attention (paged_decode.py), the fused
element-wise kernels of the decode step (fused.py), the skinny GEMM of decode batches (gemv.py), and their
float64 references (reference.py, plain torch). The kernel modules import Triton, so import them only
where they run: on CUDA, or on the CPU under Triton's interpreter (TRITON_INTERPRET=1) in tests."""
