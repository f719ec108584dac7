"""Hydra's entry point for the Ray launcher; optladder/experiments/ray_launch.py does the work. Hydra imports every
module under hydra_plugins at start-up, so this one stays light (Ray is imported only when a sweep launches).
No `from __future__ import annotations`: Hydra runs this module before it is in sys.modules, where
dataclasses cannot resolve string annotations."""
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from optladder.experiments.ray_launch import RaySettings


@dataclass
class RayLauncherConf(RaySettings):
    _target_: str = "hydra_plugins.optladder_launchers.ray_launcher.RayLauncher"


# the schema of optladder/conf/hydra/launcher/ray.yaml: a misspelt hydra.launcher key fails when the config is composed
ConfigStore.instance().store(group="hydra/launcher", name="optladder_ray", node=RayLauncherConf,
                             provider="optladder")


class RayLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        plain = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                 for k, v in params.items()}
        self.settings = RaySettings(**plain)
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from optladder.experiments.ray_launch import launch_jobs

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        return launch_jobs(self.settings, self.config, self.hydra_context, self.task_function, job_overrides,
                           initial_job_idx)
