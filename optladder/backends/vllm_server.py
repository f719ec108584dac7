"""vLLM as an engine under test: `vllm serve` in a child process of its own environment, our opts as its
arguments (optladder/backends/vllm_args.py), its Prometheus metrics as ours, and no process left behind.

    with VLLMServer(model_cfg, engine_cfg) as server:        # waits for /health
        with server.measure() as probe:                      # /metrics before, KV gauge during, after
            ... replay against server.url, model server.model ...
        metrics = probe.metrics

The interpreter is engine.server.python; by default the project's .venv-vllm if there is one, so vLLM
(and its own torch) never has to share an environment with this one.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psutil

from optladder.backends import prometheus
from optladder.backends.completions import greedy_completions
from optladder.backends.launcher import ServerProcess, free_port, install_signal_handlers
from optladder.backends.vllm_args import build_launch, check_tensor_parallel
from optladder.backends.vllm_model import model_folder
from optladder.engine.config import EngineConfig, ModelConfig, ServerConfig

from optladder.paths import PROJECT_ROOT

log = logging.getLogger(__name__)
VLLM_VENV_PYTHON = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"
VLLM_CLI = Path(__file__).with_name("vllm_cli.py")
GIB = float(1 << 30)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def vllm_python(server: ServerConfig) -> str:
    if server.python:
        return server.python
    return str(VLLM_VENV_PYTHON) if VLLM_VENV_PYTHON.exists() else sys.executable


def device_type(engine_cfg: EngineConfig) -> str:
    """Where vLLM runs, by our engine.device (auto: CUDA if this machine has it)."""
    from optladder.engine.loader import resolve_device

    return resolve_device(engine_cfg.device).type


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()  # counts what CUDA_VISIBLE_DEVICES leaves visible


class VLLMServer:
    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig, log_dir: Path | None = None,
                 wait: bool = True):
        """wait=False: launched, not awaited; wait_ready() waits for /health (a switchback launches both arms'
        servers before waiting on either: each start is a minute of imports and compilation)."""
        from optladder.backends.vllm_env import check_switches, known_version
        from optladder.engine.validation import validate_engine

        dev = device_type(engine_cfg)
        srv = engine_cfg.server
        # what this vLLM cannot run on this device and model, refused before it starts (the version is the one the
        # preflight's probe found: optladder/experiments/preflight.py)
        check_switches(engine_cfg, _head_dim(model_cfg), dev, known_version(vllm_python(srv), srv.env))
        validate_engine(engine_cfg, dev)
        self.model = srv.served_model_name or model_cfg.name
        self.max_model_len = engine_cfg.max_model_len
        check_tensor_parallel(srv.tensor_parallel_size, dev, visible_gpus() if dev == "cuda" else 0)
        path, model_args = model_folder(model_cfg)
        port = srv.port or free_port(srv.host)
        launch = build_launch(engine_cfg, dev, path, self.model, srv.host, port, model_args)
        self.cmd = [vllm_python(srv), str(VLLM_CLI), "serve", *launch.args]
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="optladder-vllm-"))
        self.log_path = log_dir / f"vllm-{port}.log"
        self._effective = launch.opts_effective
        self._bytes_per_token = _kv_bytes_per_token(model_cfg, launch.dtype)
        install_signal_handlers()
        log.info("starting vLLM: %s (env %s)", " ".join(self.cmd), launch.env)
        self._launched = time.monotonic()
        self._startup_timeout_s = srv.startup_timeout_s
        self.start_s: float | None = None
        self.process = ServerProcess(self.cmd, srv.host, port, self.log_path, env={**os.environ, **launch.env},
                                     name="vllm")
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Until the server answers /health (at most engine.server.startup_timeout_s from its launch); once."""
        if self.start_s is not None:
            return
        try:
            self.process.wait_healthy(self._startup_timeout_s, since=self._launched)  # from its launch
            self.start_s = time.monotonic() - self._launched
            self.url = self.process.url
            self.metrics_url = self.url + "/metrics"
            self.kv_blocks = prometheus.kv_blocks(prometheus.scrape(self.metrics_url))
        except BaseException:  # a server that never became healthy is stopped here (a constructor has no __exit__)
            self.process.stop()
            raise
        log.info("vLLM healthy at %s after %.1f s (log %s)", self.url, self.start_s, self.log_path)

    @contextmanager
    def measure(self, interval_s: float = 0.5):
        """Metrics of what runs inside: counter deltas, the KV gauge and the server's RSS sampled during it."""
        probe = _Probe()
        before = prometheus.scrape(self.metrics_url)
        rss = _RssSampler(self.process.proc.pid, interval_s)
        with prometheus.GaugeSampler(self.metrics_url, interval_s=interval_s) as kv, rss:
            yield probe
        after = prometheus.scrape(self.metrics_url)
        probe.metrics = prometheus.deltas(before, after, kv.samples)
        if rss.peak:
            probe.metrics["perf/peak_mem_gb"] = rss.peak / GIB  # every process of the server: API, engine core
        if self.kv_blocks and self._bytes_per_token:
            blocks, size = self.kv_blocks
            reserved = blocks * size * self._bytes_per_token
            probe.metrics["perf/kv_reserved_gb"] = reserved / GIB
            if "perf/kv_util_max" in probe.metrics:
                probe.metrics["perf/kv_used_gb"] = probe.metrics["perf/kv_util_max"] * reserved / GIB

    def generate(self, prompts: list[list[int]], max_new_tokens: int, concurrency: int,
                 progress: bool = True) -> list[str]:
        return greedy_completions(self.url, self.model, prompts, max_new_tokens, self.max_model_len, concurrency,
                                  progress=progress)

    def opts_effective(self) -> dict[str, dict]:
        out = {k: dict(v) for k, v in self._effective.items()}
        if self.kv_blocks:
            out["paged_kv"]["num_blocks"] = self.kv_blocks[0]
        return out

    def check_alive(self) -> None:
        """Raise ServerGone if `vllm serve` has exited (killed mid-replay, crashed), with its log tail."""
        rc = self.process.proc.poll()
        if rc is not None:
            raise ServerGone(f"vllm serve exited with status {rc} while the run was using it. Last lines of "
                             f"{self.log_path}:\n{self.process.log_tail()}")

    def close(self) -> None:
        self.process.stop()

    def __enter__(self) -> "VLLMServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ServerGone(RuntimeError):
    """The engine's server process died under the run."""


class _Probe:
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}  # filled when the `measure` block ends


class _RssSampler(prometheus.PeriodicSampler):
    """Peak resident memory of a process and its descendants, sampled on a thread."""

    def __init__(self, pid: int, interval_s: float):
        super().__init__(interval_s, "rss-sampler")
        self.pid, self.peak = pid, 0

    def sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
            self.peak = max(self.peak, sum(_rss(p) for p in procs))
        except psutil.Error:
            pass


def _rss(p: psutil.Process) -> int:
    try:
        return p.memory_info().rss
    except psutil.Error:
        return 0


def _head_dim(model_cfg: ModelConfig) -> int | None:
    from optladder.engine.loader import model_shape

    try:
        return model_shape(model_cfg).head_dim
    except (OSError, ValueError, KeyError):
        return None  # vLLM reads the model itself and says what is wrong with it


def _kv_bytes_per_token(model_cfg: ModelConfig, dtype: str) -> int | None:
    from optladder.engine.loader import model_shape

    try:
        s = model_shape(model_cfg)
    except (OSError, ValueError, KeyError):
        return None
    return s.kv_bytes_per_token(DTYPE_BYTES[dtype])
