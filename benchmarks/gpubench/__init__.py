"""benchmarks/gpu_bench.py's sections, one module per concern (see that script)."""
