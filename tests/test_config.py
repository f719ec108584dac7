"""The real config: every group option composes into the typed schema; mistakes fail at compose time."""
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from engine.opts import OPTS
from tests.conftest import CONF, compose_config

NEEDS_PATH = {"workload": {"mooncake", "jsonl"}, "quality": {"jsonl"}}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["model", "engine", "workload", "quality", "gate", "tracking"])
def test_every_group_option_composes_and_builds(group):
    for name in options(group):
        extra = [f"{group}.path=/some/file.jsonl"] if name in NEEDS_PATH.get(group, ()) else []
        cfg = compose_config([f"{group}={name}", *extra], cheap=False)
        obj = OmegaConf.to_object(cfg)  # runs each dataclass's own validation
        assert getattr(obj, group) is not None


def test_every_opt_file_sets_its_registered_field_and_nothing_else():
    assert set(options("opt")) == set(OPTS)
    for name, spec in OPTS.items():
        cfg = compose_config([f"+opt={name}"], cheap=False)
        base = compose_config([], cheap=False)
        changed = {k for k in cfg.engine if cfg.engine[k] != base.engine[k]}
        assert changed == {spec.field}, name
        text = (CONF / "opt" / f"{name}.yaml").read_text()
        assert text.startswith("# @package engine")
        assert ("lossless" in text) == spec.lossless


def test_several_opts_compose():
    cfg = compose_config(["+opt=[paged_kv,flash_attn,batched_decode]"])
    assert cfg.engine.paged_kv and cfg.engine.flash_attn and cfg.engine.batched_decode
    assert not cfg.engine.dynamic_batching


def test_misspelt_key_fails_at_compose():
    with pytest.raises(ConfigCompositionException) as e:
        compose_config(["engine.paged_kvv=true"])
    assert "paged_kvv" in str(e.value.__cause__ or e.value)


def test_unknown_group_option_names_the_valid_ones():
    with pytest.raises(ConfigCompositionException) as e:
        compose_config(["model=llama70b"])
    msg = str(e.value)
    assert "llama70b" in msg and "smollm2_135m" in msg and "tiny" in msg


def test_wrong_type_fails_at_compose():
    with pytest.raises(ConfigCompositionException) as e:
        compose_config(["workload.num_requests=many"])
    assert isinstance(e.value.__cause__, ValidationError) or "many" in str(e.value)


@pytest.mark.parametrize("override, field", [("workload.num_requests=0", "num_requests"),
                                             ("workload.rate=-1", "rate"),
                                             ("quality.num_prompts=0", "num_prompts"),
                                             ("replay.driver=carrier_pigeon", "replay.driver")])
def test_bad_values_fail_naming_the_field(override, field):
    cfg = compose_config([override])
    with pytest.raises(ValueError, match=field):
        OmegaConf.to_object(cfg)


def test_seed_reaches_every_seeded_group():
    cfg = compose_config(["seed=7"])
    assert cfg.engine.seed == cfg.workload.seed == cfg.quality.seed == 7


def test_data_root_from_env(monkeypatch):
    monkeypatch.setenv("OPTLADDER_DATA", "/tmp/somewhere")
    assert compose_config([]).data.root == "/tmp/somewhere"
    assert compose_config(["data.root=/elsewhere"]).data.root == "/elsewhere"
