"""Hydra sweeps on Ray: each job one Ray task that holds its own GPUs, on this machine or across a cluster.

    python run.py -m hydra/launcher=ray model=tiny seed=1,2,3,4                  # a Ray instance of its own
    ray start --head   # then, on each other host: ray start --address=HEAD:6379
    python run.py -m hydra/launcher=ray hydra.launcher.address=auto '+opt=glob(*)'

Ray sets each task's CUDA_VISIBLE_DEVICES to the GPUs it granted it (and to none for a job that asked for
none), so a job never lands on a GPU another job holds; jobs beyond the free GPUs wait in Ray's queue. A job
that asks for more GPUs than any node has is refused before any job starts: Ray would wait for ever.
Every task runs in a fresh worker process (max_calls=1), so a CUDA context, Hydra's singletons and MLflow's
active run never carry over from one job to the next. hydra_plugins/optladder_launchers is Hydra's entry.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)
# what a job needs from the launching process's environment (the MLflow parent run id among them); a Ray
# cluster's workers were started by `ray start`, not by us, so nothing else reaches them
ENV_PREFIXES = ("OPTLADDER_", "MLFLOW_", "HF_", "TRANSFORMERS_", "VLLM_", "NCCL_", "TORCH_", "NVSHMEM_",
                "OMP_NUM_THREADS")


@dataclass
class RaySettings:
    address: Optional[str] = None  # None: start a Ray instance here for this sweep; auto / ray://HOST:10001: a cluster
    num_cpus: Optional[int] = None  # the instance started here: CPUs and GPUs to schedule (None: what Ray detects)
    num_gpus: Optional[int] = None
    gpus_per_job: Any = "auto"  # auto: engine.server.tensor_parallel_size (vllm) or 1 where the cluster has GPUs, else 0
    cpus_per_job: float = 1.0
    env_prefixes: list[str] = field(default_factory=lambda: list(ENV_PREFIXES))

    def __post_init__(self) -> None:
        g = self.gpus_per_job
        if g != "auto" and not (isinstance(g, int) and not isinstance(g, bool) and g >= 0):
            raise ValueError(f"hydra.launcher.gpus_per_job={g!r}: give 'auto' or a whole number >= 0")
        if not self.cpus_per_job > 0:
            raise ValueError(f"hydra.launcher.cpus_per_job={self.cpus_per_job}: must be > 0")


def gpus_for_job(gpus_per_job: Any, engine: DictConfig, node_gpus: float) -> int:
    """GPUs one job asks Ray for. auto: none where no node has a GPU or where the model runs elsewhere."""
    if gpus_per_job != "auto":
        return int(gpus_per_job)
    if node_gpus == 0 or engine.name == "openai" or engine.device == "cpu":
        return 0
    return int(engine.server.get("tensor_parallel_size", 1)) if engine.name == "vllm" else 1


def check_fits(needs: Sequence[int], node_gpus: float, labels: Sequence[str]) -> None:
    """A task's GPUs must all be on one node; asking for more than the largest node has never runs."""
    for n, label in zip(needs, labels):
        if n > node_gpus:
            raise ValueError(f"job {label} asks for {n} GPU(s), but the largest node of the Ray cluster has "
                             f"{node_gpus:g}: lower hydra.launcher.gpus_per_job (or "
                             "engine.server.tensor_parallel_size), or add a node with more GPUs")


def check_local_gpus(num_gpus: Optional[int], physical: int) -> None:
    """More GPUs declared than this machine has would hand jobs devices that do not exist. (On a machine
    with none, declared GPUs are logical only: a dry run of the scheduling, jobs run on the CPU.)"""
    if num_gpus is not None and physical > 0 and num_gpus > physical:
        raise ValueError(f"hydra.launcher.num_gpus={num_gpus}, but this machine has {physical} GPU(s)")


def forwarded_env(prefixes: Sequence[str], cwd: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(tuple(prefixes))}
    # the project's packages (and hydra_plugins) import from the checkout, which must be at the same path
    # on every node of a cluster (a shared file system, as SLURM assumes too)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH")) if p)
    return env


def launch_jobs(settings: RaySettings, config: DictConfig, hydra_context: Any, task_function: Any,
                job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
    try:
        import ray
    except ImportError:
        raise SystemExit("error: hydra/launcher=ray needs Ray, which is not installed: pip install -e '.[ray]'") from None
    from hydra.core.singleton import Singleton
    from hydra.core.utils import filter_overrides, setup_globals

    setup_globals()
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    jobs = [_job_config(hydra_context, config, list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]
    labels = [f"#{j.hydra.job.num} ({' '.join(filter_overrides(o))})" for j, o in zip(jobs, job_overrides)]
    cwd = os.getcwd()
    started_here = _connect(settings, forwarded_env(settings.env_prefixes, cwd))
    try:
        node_gpus = max((n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]), default=0)
        needs = [gpus_for_job(settings.gpus_per_job, j.engine, node_gpus) for j in jobs]
        check_fits(needs, node_gpus, labels)
        # max_retries=0: a job whose worker died (Ray's memory monitor, a lost node) is reported failed, never
        # rerun behind the user's back beside the half-logged MLflow run of the first attempt
        run = ray.remote(max_calls=1, max_retries=0)(_run_job)
        state = Singleton.get_state()
        refs = []
        for job, n, label in zip(jobs, needs, labels):
            log.info("\t%s on Ray: %d GPU(s), %g CPU(s)", label, n, settings.cpus_per_job)
            task = run.options(num_gpus=n, num_cpus=settings.cpus_per_job)
            refs.append(task.remote(hydra_context, task_function, job, state, cwd))
        return _collect(refs)
    finally:
        if started_here:
            ray.shutdown()


def _connect(settings: RaySettings, env: dict[str, str]) -> bool:
    """Joins the cluster at settings.address, or starts an instance here; True when it started one."""
    import ray

    kwargs = dict(runtime_env={"env_vars": env}, include_dashboard=False, logging_level=logging.WARNING)
    if settings.address:
        ray.init(address=settings.address, **kwargs)
        return False
    check_local_gpus(settings.num_gpus, _physical_gpus())
    ray.init(num_cpus=settings.num_cpus, num_gpus=settings.num_gpus, **kwargs)
    return True


def _physical_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def _job_config(hydra_context: Any, config: DictConfig, overrides: list[str], num: int) -> DictConfig:
    job = hydra_context.config_loader.load_sweep_config(config, overrides)
    with open_dict(job):
        job.hydra.job.id = f"ray_{num}"
        job.hydra.job.num = num
    return job


def _collect(refs: list) -> list:
    import ray

    pending, done = list(refs), 0
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        done += len(ready)
        log.info("ray: %d/%d jobs finished", done, len(refs))
    return ray.get(refs)


def _run_job(hydra_context: Any, task_function: Any, job: DictConfig, singleton_state: dict, cwd: str) -> Any:
    """In the Ray worker: Hydra's state as the launching process had it, then the job as run.py runs it."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals

    Singleton.set_state(singleton_state)
    setup_globals()
    os.chdir(cwd)  # relative paths (hydra.sweep.dir, data, the sqlite default) mean what they meant there
    return run_job(hydra_context=hydra_context, task_function=task_function, config=job,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
