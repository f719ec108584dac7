"""The real config: every group option composes into the typed schema; mistakes fail at compose time."""
import re
import shutil
from dataclasses import asdict

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from optladder.abtest.lossless import arms_lossless, leaves
from optladder.engine.opts import OPTS
from optladder.experiments.build import build
from optladder.experiments.schema import register
from tests.conftest import CONF, compose_config

NEEDS_PATH = {"workload": {"mooncake", "jsonl"}, "quality": {"jsonl"}}
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra")  # hydra/: Hydra's own


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def selector(group: str, name: str) -> str:
    """Optional groups are added (+ab=x); the defaults list's groups are swapped (model=x)."""
    return f"+{group}={name}" if group in OPTIONAL else f"{group}={name}"


OPTIONAL = {"opt", "ab", "ladder", "soak", "profile"}


def test_every_conf_group_is_tested():
    assert set(GROUPS) == {"model", "engine", "workload", "quality", "gate", "tracking", *OPTIONAL}, GROUPS


@pytest.mark.parametrize("group", [g for g in GROUPS if g != "opt"])  # opt: its own test below
def test_every_group_option_composes_builds_and_keeps_its_values(group):
    for name in options(group):
        extra = [f"{group}.path=/some/file.jsonl"] if name in NEEDS_PATH.get(group, ()) else []
        cfg = compose_config([selector(group, name), *extra], cheap=False)
        built = asdict(getattr(build(cfg), group))  # build: every dataclass's own validation runs
        written = leaves(OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml")))
        got = leaves(built)
        for key, value in written.items():
            if isinstance(value, str) and value.startswith("${") or f"{group}.{key}=" in " ".join(extra):
                continue  # an interpolation (seed: ${seed}), or a value this test sets itself
            assert got[key] == value, f"{group}={name}: {key}"


@pytest.mark.parametrize("name", options("ab"))
def test_every_ab_arm_composes_and_builds(name):
    ab = build(compose_config([f"+ab={name}"])).ab
    assert ab.aa or ab.candidate and ab.candidate != ab.control
    for arm in (ab.control, ab.candidate):
        build(compose_config(list(arm)))  # an arm's overrides must compose, or the A/B dies after its first arm


def test_every_opt_file_sets_its_registered_field_and_nothing_else():
    assert set(options("opt")) == set(OPTS)
    base = compose_config([], cheap=False)
    for name, spec in OPTS.items():
        cfg = compose_config([f"+opt={name}"], cheap=False)
        changed = {k for k in cfg.engine if cfg.engine[k] != base.engine[k]}
        assert changed == {spec.field}, name
        assert (CONF / "opt" / f"{name}.yaml").read_text().startswith("# @package engine")


def test_losslessness_comes_from_the_registry():
    """The gate's lossless decision for `+opt=X` against the baseline is the registry's flag for X."""
    base = OmegaConf.to_container(compose_config([]), resolve=True)
    for name, spec in OPTS.items():
        opts = [*spec.needs, name]
        cand = OmegaConf.to_container(compose_config([f"+opt=[{','.join(opts)}]"]), resolve=True)
        assert arms_lossless(base, cand)[0] == all(OPTS[o].lossless for o in opts), name
    lossy = OmegaConf.to_container(compose_config(["engine.dtype=bfloat16"]), resolve=True)
    assert arms_lossless(base, lossy) == (False, "lossy: engine.dtype=auto->bfloat16")


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
    cause = e.value.__cause__
    assert isinstance(cause, ValidationError) and cause.full_key == "workload.num_requests", repr(cause)


@pytest.mark.parametrize("override, key", [("+engine.paged_kvv=true", "engine.paged_kvv"),
                                           ("+extra.anything=1", "extra"),
                                           ("+engine.extra.anything=1", "engine.extra"),
                                           ("+engine.server.hostt=x", "engine.server.hostt")])
def test_a_force_added_typo_fails_before_anything_runs(override, key):
    """`+key=` makes Hydra add the key whatever the schema says, and to_object would drop it silently."""
    cfg = compose_config([override])
    with pytest.raises(ValueError, match=re.escape(f"['{key}']")):
        build(cfg)


def test_a_typo_in_a_yaml_file_fails_at_compose(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "opt" / "typo.yaml").write_text("# @package engine\npaged_kvv: true\n")
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        with pytest.raises(ConfigCompositionException) as e:
            compose("config", overrides=["+opt=typo"])
    assert "paged_kvv" in str(e.value) and "EngineConfig" in str(e.value)


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
