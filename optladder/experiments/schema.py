"""The typed shape of the whole config. The same plain dataclasses that engine/, traffic/, quality/ and
abtest/ take are registered as Hydra schemas, so a misspelt key or a wrong type fails at compose time,
and `OmegaConf.to_object` builds them (running each one's own validation) before anything loads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore

from optladder.abtest.gates import GateConfig
from optladder.abtest.soak import SoakConfig
from optladder.backends.faults import FaultConfig
from optladder.backends.profiling import ProfileConfig
from optladder.engine.config import EngineConfig, ModelConfig
from optladder.quality.prompts import QualityConfig
from optladder.traffic.metrics import SLO
from optladder.traffic.replay_config import ReplayConfig
from optladder.traffic.workload import WorkloadConfig


@dataclass
class DataConfig:
    root: Optional[str] = None  # real traces and prompt sets; also $OPTLADDER_DATA


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str = "sqlite:///mlflow.db"  # relative paths are taken from the project root
    experiment: str = "optladder"
    run_name: Optional[str] = None
    artifact_location: Optional[str] = None  # a new experiment's; None: beside a SQLite database, else the server's
    system_metrics: bool = True
    system_metrics_interval_s: float = 2.0


ARMS = ("control", "candidate")


@dataclass
class ABConfig:
    name: str = "ab"
    control: list[str] = field(default_factory=list)  # overrides on the base config
    candidate: list[str] = field(default_factory=list)
    repeats: int = 1  # pairs of runs; the arm that opens a pair alternates: AB BA AB ...
    first: str = "control"  # the arm that opens the first pair: control | candidate
    aa: bool = False  # an A/A: the arms are meant to be the same config (optladder/conf/ab/aa.yaml)
    registry_dir: Optional[str] = None  # promoted baselines; None: <project>/rollouts
    # runs: each arm replays the whole trace in its own run (ab.repeats pairs of them); switchback: both arms'
    # engines loaded at once, the trace played in ab.blocks blocks, the arms taking turns (AB AB ...), the latency
    # gates' interval from resampling blocks (optladder/experiments/switchback.py)
    design: str = "runs"
    blocks: int = 10
    # sequential stopping of a switchback: the latency gates are looked at after each of `looks` equal shares of
    # the blocks, every interval at gate.alpha / looks (Bonferroni over the looks, so peeking keeps the error
    # rates); the replay stops at the first look where every latency gate is decided. 1: one look, at the end
    looks: int = 1

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"ab.repeats must be >= 1, got {self.repeats}")
        check_design(self.design, self.blocks, self.repeats, "ab")
        check_looks(self.looks, self.design, self.blocks, "ab")
        if self.first not in ARMS:
            raise ValueError(f"ab.first={self.first!r} is not one of {list(ARMS)}")
        if list(self.candidate) == list(self.control) and not self.aa:
            raise ValueError(f"ab.candidate {list(self.candidate)} is the control's own overrides: give the "
                             "overrides that make the candidate, e.g. ab.candidate=[+opt=flash_attn], or run "
                             "an A/A on purpose with +ab=aa")


DESIGNS = ("runs", "switchback")


def check_looks(looks: int, design: str, blocks: int, group: str) -> None:
    """Sequential stopping's settings (ab.looks, ladder.looks), refused before anything runs."""
    if not isinstance(looks, int) or isinstance(looks, bool) or looks < 1:
        raise ValueError(f"{group}.looks must be an integer >= 1 (1: no interim look), got {looks!r}")
    if looks > 1 and design != "switchback":
        raise ValueError(f"{group}.looks={looks} stops a switchback early; {group}.design={design!r} has no "
                         f"blocks to stop between: set {group}.design=switchback or leave {group}.looks=1")
    if looks > 1 and blocks < 2 * looks:
        raise ValueError(f"{group}.looks={looks} needs at least 2 blocks a look (an interval needs 2 blocks), "
                         f"{group}.blocks={blocks} has {blocks / looks:.1f}: raise {group}.blocks to "
                         f"{2 * looks} or lower {group}.looks")


def check_design(design: str, blocks: int, repeats: int, group: str) -> None:
    if design not in DESIGNS:
        raise ValueError(f"{group}.design={design!r} is not one of {', '.join(DESIGNS)}")
    if design == "switchback":
        if not isinstance(blocks, int) or blocks < 2:
            raise ValueError(f"{group}.blocks must be an integer >= 2 (the blocks a switchback resamples), got {blocks!r}")
        if repeats != 1:
            raise ValueError(f"{group}.repeats={repeats} counts whole-run pairs of {group}.design=runs; a switchback "
                             f"repeats by blocks: set {group}.blocks (now {blocks}) and leave {group}.repeats=1")


RERUN_CONTROL = ("differs", "always", "never")


@dataclass
class LadderConfig:
    name: str = "ladder"
    rungs: list[str] = field(default_factory=list)  # opt names, one added per rung
    repeats: int = 1
    keep_inconclusive: bool = True  # a rung that fails is always left out; an undecided one is kept, flagged
    stop_on_error: bool = False  # a rung that raises (e.g. CUDA out of memory) is left out and the ladder goes on
    resume_from: Optional[str] = None  # an earlier run directory of this ladder: its finished rungs are reused
    # a rung about to run here against one read back from resume_from: run that control again here first (as
    # <rung>-here-<rung it controls>) when the environments differ (differs: a machine, versions or code;
    # optladder/abtest/environment.py), always, or never (its latency gates then report instead of deciding,
    # gate.environment_check); a later resume reads such a rerun back when it ran in the candidate's environment
    rerun_control: str = "differs"
    # each rung's replay runs beside a run of its control made just before it (<control>-again-<rung>-r<k>,
    # alternating AB BA over repeats, no quality prompts: the control's own answers stand), and the rung's
    # latency is gated against that run: a machine whose speed drifts over minutes (an eager GPU step is the
    # host's speed at launching kernels) then moves both arms of a gate alike. Costs one more replay a rung
    interleave: bool = False
    # under interleave: each control run beside a rung and that control's own run are an A/A pair; the latency
    # gates' gate.run_noise pools the pairs measured so far (one df each) with its prior (optladder/abtest/verdict.py)
    pool_noise: bool = True
    # switchback: each rung and its control beside it (as under interleave) loaded at once, the trace played in
    # ladder.blocks blocks, the two taking turns (optladder/experiments/switchback.py); runs: whole replays
    design: str = "runs"
    blocks: int = 10
    # sequential stopping of each rung's switchback, as ab.looks: the rung's latency gates looked at after each of
    # `looks` equal shares of the blocks at gate.alpha / looks; its replay stops at the first look that decides them
    looks: int = 1

    def __post_init__(self) -> None:
        from optladder.engine.opts import OPTS

        check_design(self.design, self.blocks, self.repeats, "ladder")
        check_looks(self.looks, self.design, self.blocks, "ladder")

        if self.rerun_control not in RERUN_CONTROL:
            raise ValueError(f"ladder.rerun_control={self.rerun_control!r} is not one of {', '.join(RERUN_CONTROL)}")

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
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    slo: SLO = field(default_factory=SLO)
    faults: FaultConfig = field(default_factory=FaultConfig)  # test-only (optladder/backends/faults.py)
    data: DataConfig = field(default_factory=DataConfig)
    seed: int = 0
    ab: Optional[ABConfig] = None
    ladder: Optional[LadderConfig] = None
    soak: Optional[SoakConfig] = None
    profile: Optional[ProfileConfig] = None  # +profile=torch: a torch profiler trace of the replay's middle


def register() -> None:
    ConfigStore.instance().store(name="base_config", node=Config)
