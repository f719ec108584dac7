"""The config snapshot every experiment leaves behind: resolved config, overrides, environment, and the
digests of exactly what was replayed and scored. Enough to rerun it, and to diff two runs."""
from __future__ import annotations

import datetime as dt
import functools
import hashlib
import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
import uuid
from pathlib import Path

from optladder.paths import PACKAGE
PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "scipy", "hydra-core", "omegaconf",
            "mlflow", "mlflow-skinny", "sacrebleu", "rouge-score", "locust", "triton", "vllm", "optladder")
SNAPSHOT_FILE = "config_snapshot.json"
# what runs (their source files' digest is the code_id): a commit of documents or results leaves it as it was
CODE_PATHS = ("optladder", "hydra_plugins", "run.py", "pyproject.toml")  # under the package's parent
# this process: two runs of one process are comparable whatever else they recorded (optladder/abtest/environment.py)
PROCESS = uuid.uuid4().hex


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment() -> dict:
    env: dict = {"python": sys.version.split()[0], "platform": platform.platform(),
                 "machine": platform.machine(), "processor": platform.processor() or None,
                 # which machine: a ladder resumed elsewhere compares runs of two (optladder/abtest/environment.py). Rented
                 # VMs may all be called "vm" with a generic CPU name: the boot and the GPU's UUID tell them apart
                 "host": platform.node() or None, "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(),
                 "boot_id": _read("/proc/sys/kernel/random/boot_id")}
    pkgs = {}
    for name in PACKAGES:
        try:
            pkgs[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    env["packages"] = pkgs
    # the GPUs a launcher (Ray, SLURM) granted this job; None: all of the machine's
    env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpu_count"] = torch.cuda.device_count()
            env["gpu_uuid"] = str(getattr(torch.cuda.get_device_properties(0), "uuid", "")) or None
            env["driver"] = _nvidia_driver()
        env["cpu_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    env["git_commit"], env["git_dirty"], env["code_id"] = _code()
    env["process"] = PROCESS
    return env


@functools.lru_cache(maxsize=1)
def _code() -> tuple[str | None, bool | None, str | None]:
    """(commit, dirty, code_id), read once a process: the code a process runs is the code it loaded. code_id: a
    digest of the source files under CODE_PATHS as they are on disk (.py, .yaml, .toml; git or no git, so an
    installed copy or an uncommitted edit counts); commit and dirty: what git says, None where it cannot."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain") if commit else None
    return commit, (bool(status) if status is not None else None), _code_id()


def _code_id() -> str | None:
    h = hashlib.sha256()
    files = 0
    for top in CODE_PATHS:
        path = PACKAGE.parent / top
        found = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for f in found:
            if f.suffix not in (".py", ".yaml", ".yml", ".toml") or "__pycache__" in f.parts or not f.is_file():
                continue
            try:
                data = f.read_bytes()
            except OSError:
                continue
            h.update(f.relative_to(PACKAGE.parent).as_posix().encode() + b"\0" + hashlib.sha256(data).digest())
            files += 1
    return h.hexdigest()[:16] if files else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


@functools.lru_cache(maxsize=1)
def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def build_snapshot(resolved_config: dict, overrides: list[str], choices: dict) -> dict:
    return {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "resolved_config": resolved_config, "overrides": list(overrides), "choices": dict(choices),
            "environment": environment(), "requests_digest": None, "prompts_digest": None}


def write_snapshot(run_dir: Path, snapshot: dict) -> Path:
    path = Path(run_dir) / SNAPSHOT_FILE
    path.write_text(json.dumps(snapshot, indent=2, sort_keys=True, default=str))
    return path
