"""The typed shape of the whole config. The same plain dataclasses that engine/, traffic/, quality/ and
abtest/ take are registered as Hydra schemas, so a misspelt key or a wrong type fails at compose time,
and `OmegaConf.to_object` builds them (running each one's own validation) before anything loads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from abtest.gates import GateConfig
from backends import DRIVERS
from backends.profiling import ProfileConfig
from engine.config import EngineConfig, ModelConfig
from quality.prompts import QualityConfig
from traffic.capacity import MODES as CAPACITY_MODES, validate_search
from traffic.load_levels import validate_levels
from traffic.metrics import SLO
from traffic.workload import WorkloadConfig



@dataclass
class DataConfig:
    root: Optional[str] = None  # real traces and prompt sets; also $OPTLADDER_DATA


@dataclass
class ReplaySection:
    driver: str = "inprocess"
    warmup_requests: int = 2
    lateness_warn_ms: float = 50.0
    progress: bool = True
    request_timeout_s: float = 3600.0  # locust: per request, queueing included (a CPU replay queues for minutes)
    # capacity search, after the main replay: python run.py replay.capacity=true [replay.capacity_mode=rate]
    capacity: bool = False
    capacity_mode: str = "concurrency"  # concurrency: closed loop | rate: open loop, Poisson, req/s
    capacity_lo: float = 1.0
    capacity_hi: float = 64.0
    capacity_iters: int = 6  # bisection probes after lo and hi
    capacity_requests: int = 32  # per probe, the workload's first requests (cycled if fewer)
    # after the main replay, the same requests at each load: time scales (arrival=trace), rates in req/s
    # (poisson, gamma) or concurrencies (closed); traffic/load_levels.py
    load_levels: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.driver not in DRIVERS:
            raise ValueError(f"replay.driver={self.driver!r} is not one of {list(DRIVERS)}")
        if self.warmup_requests < 0:
            raise ValueError(f"replay.warmup_requests must be >= 0, got {self.warmup_requests}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"replay.request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.capacity_mode not in CAPACITY_MODES:
            raise ValueError(f"replay.capacity_mode={self.capacity_mode!r} is not one of {list(CAPACITY_MODES)}")
        validate_search(self.capacity_lo, self.capacity_hi, self.capacity_mode, self.capacity_iters)
        if self.capacity_requests < 1:
            raise ValueError(f"replay.capacity_requests must be >= 1, got {self.capacity_requests}")
        validate_levels(list(self.load_levels), "poisson")  # the arrival-specific check runs with the workload


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str = "sqlite:///mlflow.db"  # relative paths are taken from the project root
    experiment: str = "optladder"
    run_name: Optional[str] = None
    artifact_location: Optional[str] = None  # a new experiment's; None: beside a SQLite database, else the server's
    system_metrics: bool = True
    system_metrics_interval_s: float = 2.0


@dataclass
class ABConfig:
    name: str = "ab"
    control: list[str] = field(default_factory=list)  # overrides on the base config
    candidate: list[str] = field(default_factory=list)
    repeats: int = 1  # alternating: control, candidate, control, candidate...
    registry_dir: Optional[str] = None  # promoted baselines; None: <project>/rollouts

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"ab.repeats must be >= 1, got {self.repeats}")
        if not self.candidate:
            raise ValueError("ab.candidate is empty: give the overrides that make the candidate, "
                             "e.g. ab.candidate=[+opt=flash_attn]")


@dataclass
class LadderConfig:
    name: str = "ladder"
    rungs: list[str] = field(default_factory=list)  # opt names, one added per rung
    repeats: int = 1
    keep_inconclusive: bool = True  # a rung that fails is always left out; an undecided one is kept, flagged

    def __post_init__(self) -> None:
        from engine.opts import OPTS

        bad = [r for r in self.rungs if r not in OPTS]
        if bad or not self.rungs:
            raise ValueError(f"ladder.rungs {bad or '[]'}: each rung is one of {sorted(OPTS)}")
        if self.repeats < 1:
            raise ValueError(f"ladder.repeats must be >= 1, got {self.repeats}")


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
    profile: Optional[ProfileConfig] = None  # +profile=torch: a torch profiler trace of the replay's middle
    extra: dict[str, Any] = field(default_factory=dict)


def register() -> None:
    ConfigStore.instance().store(name="base_config", node=Config)
