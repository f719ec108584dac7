"""The typed shape of the whole config. The same plain dataclasses that engine/, traffic/, quality/ and
abtest/ take are registered as Hydra schemas, so a misspelt key or a wrong type fails at compose time,
and `OmegaConf.to_object` builds them (running each one's own validation) before anything loads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from abtest.gates import GateConfig
from engine.config import EngineConfig, ModelConfig
from quality.prompts import QualityConfig
from traffic.metrics import SLO
from traffic.workload import WorkloadConfig

DRIVERS = ("inprocess", "locust")


@dataclass
class DataConfig:
    root: Optional[str] = None  # real traces and prompt sets; also $OPTLADDER_DATA


@dataclass
class ReplaySection:
    driver: str = "inprocess"
    warmup_requests: int = 2
    lateness_warn_ms: float = 50.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.driver not in DRIVERS:
            raise ValueError(f"replay.driver={self.driver!r} is not one of {list(DRIVERS)}")
        if self.warmup_requests < 0:
            raise ValueError(f"replay.warmup_requests must be >= 0, got {self.warmup_requests}")


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str = "sqlite:///mlflow.db"  # relative paths are taken from the project root
    experiment: str = "optladder"
    run_name: Optional[str] = None
    system_metrics: bool = True
    system_metrics_interval_s: float = 2.0


@dataclass
class ABConfig:
    name: str = "ab"
    control: list[str] = field(default_factory=list)  # overrides on the base config
    candidate: list[str] = field(default_factory=list)
    repeats: int = 1  # alternating: control, candidate, control, candidate...
    review_html: bool = True


@dataclass
class LadderConfig:
    name: str = "ladder"
    rungs: list[str] = field(default_factory=list)  # opt names, one added per rung
    repeats: int = 1


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    replay: ReplaySection = field(default_factory=ReplaySection)
    slo: SLO = field(default_factory=SLO)
    data: DataConfig = field(default_factory=DataConfig)
    seed: int = 0
    ab: Optional[ABConfig] = None
    ladder: Optional[LadderConfig] = None
    extra: dict[str, Any] = field(default_factory=dict)


def register() -> None:
    ConfigStore.instance().store(name="base_config", node=Config)
