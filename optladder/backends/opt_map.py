"""How an engine realises each opt, as data: the arguments it passes, or why the opt is always on, or why
it only describes the engine. Shared by every adapter so `opts_effective` reads the same everywhere, and
an opt an engine has no mapping for is refused the same way, naming the engine and what it supports."""
from __future__ import annotations

from dataclasses import dataclass, field

from optladder.engine.opts import OPTS, enabled_opts

# how an opt is in effect on an engine
MAPPED = "mapped"  # our switch sets the engine's own argument, both ways
ALWAYS_ON = "always_on"  # the engine cannot switch it off: in effect whatever our config says
FIXED = "fixed"  # the engine has one implementation, neither our on nor our off (e.g. no CUDA graphs on CPU)
METADATA = "metadata"  # recorded only: we do not configure the engine (engine=openai)
STATES = (MAPPED, ALWAYS_ON, FIXED, METADATA)


@dataclass
class OptMapping:
    """One opt on one engine: what was asked, what the engine does, and the evidence."""

    opt: str
    requested: bool
    state: str
    on: bool | None  # in effect? None: unknown (an endpoint we do not control)
    how: str  # the engine's own argument(s), or the reason
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.state in STATES, self.state
        assert self.opt in OPTS, self.opt

    def evidence(self) -> dict:
        """The opts_effective entry: `on` is the truth about the engine, `requested` our config."""
        out = {"on": self.on, "requested": self.requested, "state": self.state, "how": self.how}
        if self.args:
            out["args"] = list(self.args)
        return {**out, **self.extra}


def refuse_unmapped(engine: str, requested: list[str], supported: list[str] | tuple[str, ...]) -> None:
    """A requested opt the engine cannot honour is an error, never silently ignored."""
    bad = [o for o in requested if o not in supported]
    if bad:
        raise ValueError(f"engine={engine} has no mapping for opt(s) {bad}; it supports {sorted(supported)}. "
                         f"Drop +opt={','.join(bad)} or run them on engine=reference")


def requested_opts(engine_cfg) -> list[str]:
    return enabled_opts(engine_cfg)


def collect(mappings: list[OptMapping]) -> tuple[list[str], dict[str, str], dict[str, dict]]:
    """Arguments, environment and the opts_effective table of a list of mappings."""
    args: list[str] = []
    env: dict[str, str] = {}
    effective: dict[str, dict] = {}
    for m in mappings:
        args += m.args
        env.update(m.env)
        effective[m.opt] = m.evidence()
    return args, env, effective
