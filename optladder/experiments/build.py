"""From a composed config to the typed dataclasses, refusing any key the schema does not have.

Hydra already refuses `engine.paged_kvv=true` and a misspelt key in a YAML file when it composes, but an
override with a leading `+` (`+engine.paged_kvv=true`) force-adds the key, and `OmegaConf.to_object` then
drops it without a word: the run would go ahead with the switch off. Every run builds its config here, so
such a key fails before anything loads, naming the valid keys.
"""
from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf


def unknown_keys(node: DictConfig, path: str = "") -> list[str]:
    """Dotted keys of `node` (a structured config) that no schema dataclass declares, depth first."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return []  # a plain dict or a list field: any key is the user's data
    names = {f.name for f in dataclasses.fields(schema)}
    out = []
    for key in node.keys():
        if key not in names:
            out.append(f"{path}{key}")
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            out.extend(unknown_keys(child, f"{path}{key}."))
    return out


def check_keys(cfg: DictConfig) -> None:
    bad = unknown_keys(cfg)
    if not bad:
        return
    first = bad[0]
    parent = first.rpartition(".")[0]
    node = OmegaConf.select(cfg, parent) if parent else cfg
    valid = sorted(f.name for f in dataclasses.fields(OmegaConf.get_type(node)))
    raise ValueError(f"unknown config key(s) {bad}: {first.rpartition('.')[2]!r} is not a key of "
                     f"{parent or 'the config'}; valid: {valid}")


def build(cfg: DictConfig):
    """The typed config (optladder/experiments/schema.py's Config), each dataclass validating its own fields."""
    check_keys(cfg)
    return OmegaConf.to_object(cfg)
