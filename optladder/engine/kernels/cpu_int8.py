"""Weight-only int8 products for float32 decode rows on a CPU: y = x · (q · s)ᵀ, q int8 [N, K], s [N].

Why it exists: decoding on a CPU is bound by reading the weights from memory (SmolLM2 in float32 reads ~540 MB a
step), so int8 weights can only pay if a kernel reads the int8 codes once and widens them in registers. torch has
no such kernel for float32 rows (`_weight_int8pack_mm` is fast only for bfloat16 rows), and dequantizing to a
float32 copy before F.linear writes and reads four bytes a weight again: slower than float32 weights themselves.

The kernel is a few lines of C, compiled once with the host's C compiler (`cc -O3 -march=native -fopenmp`, no
torch headers, well under a second) into the cache folder and loaded with ctypes. It loads against the OpenMP
runtime torch has already loaded (the same soname), so it shares torch's threads and runs with
torch.get_num_threads() of them. Without a C compiler `kernel()` returns None and says why in `unavailable()`;
QuantLinear then dequantizes, and opts_effective names the kernel that ran and why. OPTLADDER_CPU_INT8_KERNEL=0
turns it off (the dequantizing path, e.g. to compare).

Blocking: four output rows at a time share each activation load (four independent accumulators, so the
multiply-adds do not wait on each other), the int8 codes of a 128-wide slice are widened to float32 once into
an L1-resident buffer and used for every row of x. Sums run in float32 in a different order than F.linear's.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from optladder.paths import PROJECT_ROOT

import torch

SOURCE = r"""
#include <stdint.h>
#define KB 128
#define NB 4
#define MAX_M 64
static void rows_block(const float* x, const int8_t* q, const float* s, float* y,
                       long M, long N, long K, long n0, long nb) {
  float acc[NB][MAX_M];
  float wf[NB][KB];
  for (long r = 0; r < NB; r++) for (long m = 0; m < M; m++) acc[r][m] = 0.f;
  for (long k0 = 0; k0 < K; k0 += KB) {
    long kb = K - k0 < KB ? K - k0 : KB;
    for (long r = 0; r < NB; r++) {
      const int8_t* w = q + (n0 + (r < nb ? r : 0)) * K + k0;  /* a short last block repeats its first row */
      #pragma omp simd
      for (long k = 0; k < kb; k++) wf[r][k] = (float)w[k];
    }
    for (long m = 0; m < M; m++) {
      const float* xr = x + m * K + k0;
      float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
      #pragma omp simd reduction(+:a0,a1,a2,a3)
      for (long k = 0; k < kb; k++) {
        float xv = xr[k];
        a0 += xv * wf[0][k]; a1 += xv * wf[1][k]; a2 += xv * wf[2][k]; a3 += xv * wf[3][k];
      }
      acc[0][m] += a0; acc[1][m] += a1; acc[2][m] += a2; acc[3][m] += a3;
    }
  }
  for (long r = 0; r < nb; r++)
    for (long m = 0; m < M; m++) y[m * N + n0 + r] = acc[r][m] * s[n0 + r];
}
int optladder_int8_gemm(const float* x, const int8_t* q, const float* s, float* y,
                        long M, long N, long K, int nthreads) {
  if (M < 1 || M > MAX_M) return 1;
  long blocks = (N + NB - 1) / NB;
  #pragma omp parallel for num_threads(nthreads) schedule(static)
  for (long b = 0; b < blocks; b++) {
    long n0 = b * NB, nb = N - n0 < NB ? N - n0 : NB;
    rows_block(x, q, s, y, M, N, K, n0, nb);
  }
  return 0;
}
"""
MAX_M = 64  # the C kernel's accumulator rows
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
PORTABLE_FLAGS = ("-O3", "-shared", "-fPIC")  # a compiler that refuses -march=native or -fopenmp: one thread

# OPTLADDER_CPU_INT8_KERNEL=0 at start-up turns the kernel off; kernel() reads ENABLED at every call, so a
# benchmark can toggle it in-process
ENABLED = os.environ.get("OPTLADDER_CPU_INT8_KERNEL", "1") != "0"

_lock = threading.Lock()
_fn = None
_why: str | None = None
_tried = False


def _cache_dir() -> Path:
    """$OPTLADDER_CACHE/kernels, else <project>/.cache/kernels; a folder that cannot be written: the temp dir's."""
    root = os.environ.get("OPTLADDER_CACHE") or PROJECT_ROOT / ".cache"
    d = Path(root) / "kernels"
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"optladder-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"


def _cpu_flags() -> str:
    try:  # -march=native ties the library to this CPU: its flags are part of the cache key
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _build() -> Path:
    cc = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc") or ""]
    if not cc[0]:
        raise RuntimeError("no C compiler found (cc or gcc on PATH, or $CC)")
    try:
        version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError as e:
        raise RuntimeError(f"the C compiler {' '.join(cc)!r} does not run: {e}") from e
    key = hashlib.sha256("\0".join((SOURCE, " ".join(FLAGS), version, platform.machine(),
                                    _cpu_flags())).encode()).hexdigest()[:16]
    out = _cache_dir() / f"int8_gemm-{key}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "int8_gemm.c"
        src.write_text(SOURCE)
        lib = Path(tmp) / out.name
        for flags in (FLAGS, PORTABLE_FLAGS):
            proc = subprocess.run([*cc, *flags, str(src), "-o", str(lib)], capture_output=True, text=True,
                                  timeout=120)
            if proc.returncode == 0:
                break
        else:
            raise RuntimeError(f"{' '.join(cc)} failed: {(proc.stderr or proc.stdout).strip()[-400:]}")
        os.replace(lib, out)  # atomic: a concurrent build of the same key writes the same bytes
    return out


def kernel():
    """The loaded C function, or None (then `unavailable()` says why). Built on first use, once per process."""
    global _fn, _why, _tried
    if not ENABLED:
        return None
    if _tried:
        return _fn
    with _lock:
        if not _tried:
            try:
                fn = ctypes.CDLL(str(_build())).optladder_int8_gemm
                fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
                fn.restype = ctypes.c_int
                _fn = fn
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                _why = f"the CPU int8 kernel could not be built: {e}"
            _tried = True
    return _fn


def unavailable() -> str | None:
    if not ENABLED:
        return "the CPU int8 kernel is turned off (OPTLADDER_CPU_INT8_KERNEL=0)"
    kernel()
    return _why


def int8_linear(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 (M <= MAX_M), q [N, K] int8, s [N] float32, all on the CPU -> [M, N] float32."""
    fn = kernel()
    if fn is None:
        raise RuntimeError(unavailable())
    if x.dtype != torch.float32 or q.dtype != torch.int8 or s.dtype != torch.float32 \
            or {t.device.type for t in (x, q, s)} != {"cpu"}:
        raise TypeError(f"int8_linear takes float32 rows, int8 codes and float32 scales on the CPU, not "
                        f"{x.dtype}, {q.dtype}, {s.dtype} on {x.device}, {q.device}, {s.device}")
    if x.dim() != 2 or q.dim() != 2:
        raise ValueError(f"int8_linear: x [M, K] and q [N, K], not {tuple(x.shape)} and {tuple(q.shape)}")
    m, k = x.shape
    n = q.shape[0]
    if not 1 <= m <= MAX_M or q.shape[1] != k or s.shape != (n,):
        raise ValueError(f"int8_linear: shapes x {tuple(x.shape)}, q {tuple(q.shape)}, s {tuple(s.shape)} "
                         f"(1 <= M <= {MAX_M}, q [N, K], s [N])")
    x, q, s = x.contiguous(), q.contiguous(), s.contiguous()
    y = torch.empty(m, n, dtype=torch.float32, device="cpu")
    rc = fn(x.data_ptr(), q.data_ptr(), s.data_ptr(), y.data_ptr(), m, n, k, torch.get_num_threads())
    if rc:
        raise RuntimeError(f"int8 kernel refused M={m}")
    return y
