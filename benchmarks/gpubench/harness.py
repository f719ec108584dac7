"""What every section of the GPU bench shares: the device, the results dict and how a section records into
it (a failure is recorded and the next section still runs), timing on the GPU and on the wall clock, the
environment and the copy bandwidth every floor is computed from."""
from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
import traceback
from pathlib import Path

import torch

DEV = torch.device("cuda")
BF16 = torch.bfloat16
TOL = 1e-2  # relative error against float64 that a kernel check must stay within
RESULTS: dict = {}


def log(*a) -> None:
    print(*a, flush=True)


def save(out: Path) -> None:
    (out / "gpu_bench.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def section(name: str, out: Path):
    """Run one section; a failure is recorded and the next section still runs."""
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            RESULTS[name] = fn()
        except Exception as e:  # noqa: BLE001 - the run must go on and report what failed
            RESULTS[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            log(f"!! {name} failed: {e}")
        RESULTS.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
        save(out)
        return fn
    return wrap


def gpu_median_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def wall_median_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def poison_allocator(mb: int = 512) -> None:
    """Fill memory the caching allocator will hand out next with NaN: an output the kernel forgets to
    write then shows up as NaN instead of as stale zeros."""
    torch.empty(mb << 20, dtype=torch.uint8, device=DEV).view(BF16).fill_(float("nan"))


def environment(cmd: str) -> dict:
    import transformers
    import triton

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    p = torch.cuda.get_device_properties(DEV)
    return {"command": cmd, "gpu": p.name, "nvidia_smi": smi, "sms": p.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def copy_bandwidth() -> dict:
    n = 4 << 30  # 4 GiB each way: far past the 60 MB L2
    src = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    ms = gpu_median_ms(lambda: dst.copy_(src), iters=20)  # noqa: F821 (run before the del below)
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes_each_way": n, "ms": ms, "tb_s": 2 * n / ms / 1e9, "counted": "read + written"}
