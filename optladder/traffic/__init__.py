"""Traffic: real request traces, distribution-preserving samples, exact-length prompts, arrival schedules.

`build_workload(WorkloadConfig(...), tokenizer, max_model_len, data_root)` is the entry point; the
modules below it are usable alone (traces -> sampling -> arrivals, materialize -> workload).
No torch, Hydra or MLflow here: a tokenizer is passed in as an object with `encode` / `decode`.
"""
from optladder.traffic.arrivals import gamma_arrivals, poisson_arrivals, trace_arrivals
from optladder.traffic.materialize import TokenPool, build_pool, materialize
from optladder.traffic.request import Request, RequestRecord
from optladder.traffic.sampling import fit_lengths, ks_distance, stratified_sample, window_sample
from optladder.traffic.traces import LoadedTrace, TraceRow, load_trace, resolve_data_path
from optladder.traffic.workload import Workload, WorkloadConfig, build_workload

__all__ = [
    "LoadedTrace", "Request", "RequestRecord", "TokenPool", "TraceRow", "Workload", "WorkloadConfig",
    "build_pool", "build_workload", "fit_lengths", "gamma_arrivals", "ks_distance", "load_trace",
    "materialize", "poisson_arrivals", "resolve_data_path", "stratified_sample", "trace_arrivals",
    "window_sample",
]
