"""Prompt sets for the quality check: the built-in set, AlpacaEval, self-instruct, or a user's own file
(optladder/quality/user_sets.py).

Every set becomes a list of `PromptItem`s in a fixed order, so both arms of an A/B see the same
prompts; `prompts_digest` proves it. External sets are read from a data root (config key `data.root`
or env `OPTLADDER_DATA`), never bundled: only the built-in set ships with the code.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from optladder.paths import refuse_directory
from optladder.quality.item import PromptItem
from optladder.quality.user_sets import ON_BAD_ROW, read_rows, read_user_set

log = logging.getLogger(__name__)
PROMPT_SETS = ("builtin", "alpaca_eval", "self_instruct", "jsonl")
BUILTIN_PATH = Path(__file__).with_name("builtin_prompts.jsonl")
ALPACA_EVAL_FILE = "prompts/alpaca_eval_davinci003.json"
SELF_INSTRUCT_FILE = "prompts/self_instruct_user_oriented.jsonl"
AUTO = "auto"
_HOW_TO_SET_ROOT = "set the config key data.root=/path/to/data or the environment variable OPTLADDER_DATA"


@dataclass
class QualityConfig:
    """Which prompt set, how many prompts, and how long the greedy answers may be."""

    name: str = "builtin"
    num_prompts: int = 200
    # an integer, or `auto`: the 90th percentile of the references' token lengths (each prompt's longest),
    # at most max_new_tokens_cap. BLEU punishes answers cut shorter than their references (brevity penalty)
    max_new_tokens: Any = 64
    max_new_tokens_cap: int = 512
    seed: int = 0  # alpaca_eval's draw
    path: Optional[str] = None  # name=jsonl: the user's file
    on_bad_row: str = "error"  # name=jsonl: error | skip (and count) a row that cannot be scored
    review_prompts: int = 50  # rows of the human-review HTML of an A/B

    def __post_init__(self) -> None:
        if self.name not in PROMPT_SETS:
            raise ValueError(f"quality.name={self.name!r} is not a prompt set; "
                             f"valid: {', '.join(PROMPT_SETS)}")
        mnt = self.max_new_tokens
        if mnt != AUTO and (not isinstance(mnt, int) or isinstance(mnt, bool) or mnt < 1):
            raise ValueError(f"quality.max_new_tokens must be an integer >= 1 or {AUTO!r}, got {mnt!r}")
        for key in ("num_prompts", "max_new_tokens_cap"):
            if getattr(self, key) < 1:
                raise ValueError(f"quality.{key} must be >= 1, got {getattr(self, key)}")
        if self.review_prompts < 0:
            raise ValueError(f"quality.review_prompts must be >= 0, got {self.review_prompts}")
        if self.on_bad_row not in ON_BAD_ROW:
            raise ValueError(f"quality.on_bad_row={self.on_bad_row!r} is not one of {', '.join(ON_BAD_ROW)}")
        if self.name == "jsonl" and not self.path:
            raise ValueError("quality=jsonl needs quality.path=FILE: your prompt set (JSONL or JSON; "
                             "prompt rows, Alpaca rows or chat rows, docs/workloads.md, 'Quality sets')")
        if self.path and self.name != "jsonl":
            # a path that is silently ignored would score the wrong set and exit 0
            raise ValueError(f"quality.path={self.path!r} is read only by quality=jsonl, but the set is "
                             f"quality={self.name}: use quality=jsonl quality.path={self.path}")


def load_prompt_set(cfg: QualityConfig, data_root: str | None) -> list[PromptItem]:
    """The prompts of `cfg.name` in a deterministic order; a None data_root falls back to $OPTLADDER_DATA."""
    if cfg.name == "builtin":
        items, _ = read_user_set(BUILTIN_PATH)
        if cfg.num_prompts > len(items):
            raise ValueError(f"quality.num_prompts={cfg.num_prompts} exceeds the builtin set's "
                             f"{len(items)} prompts")
        return items[: cfg.num_prompts]
    if cfg.name == "jsonl":
        return _user_set(cfg)
    if cfg.name == "alpaca_eval":
        return _alpaca_eval(_data_file(data_root, ALPACA_EVAL_FILE, cfg.name), cfg.num_prompts, cfg.seed)
    if cfg.name == "self_instruct":
        return _self_instruct(_data_file(data_root, SELF_INSTRUCT_FILE, cfg.name))[: cfg.num_prompts]
    raise ValueError(f"quality.name={cfg.name!r} is not a prompt set; valid: {', '.join(PROMPT_SETS)}")


def _user_set(cfg: QualityConfig) -> list[PromptItem]:
    path = Path(cfg.path).expanduser()
    items, skipped = read_user_set(path, cfg.on_bad_row)
    if skipped:
        log.warning("quality: %s: skipped %d bad rows (quality.on_bad_row=skip)", path, skipped)
    if len(items) < cfg.num_prompts:
        log.warning("quality: %s holds %d usable prompts, fewer than quality.num_prompts=%d: scoring all %d",
                    path, len(items), cfg.num_prompts, len(items))
    return items[: cfg.num_prompts]


def resolve_max_new_tokens(cfg: QualityConfig, items: list[PromptItem], tokenizer: Any) -> int:
    """quality.max_new_tokens, with `auto` made a number from the references' lengths in this tokenizer."""
    if cfg.max_new_tokens != AUTO:
        return int(cfg.max_new_tokens)
    longest = [max(len(tokenizer.encode(r, add_special_tokens=False)) for r in it.references) for it in items]
    return max(1, min(cfg.max_new_tokens_cap, math.ceil(float(np.percentile(longest, 90)))))


def prompts_digest(items: list[PromptItem]) -> str:
    """sha256 over ids, prompts (chat turns too) and references, in order: equal digests mean identical sets."""
    canon = json.dumps([[it.id, it.prompt, it.references, *([it.messages] if it.messages else [])]
                        for it in items], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def _data_file(data_root: str | None, rel: str, name: str) -> Path:
    root = data_root or os.environ.get("OPTLADDER_DATA")
    if not root:
        raise FileNotFoundError(f"quality={name} reads {rel} under a data root, and none is set: "
                                f"{_HOW_TO_SET_ROOT}")
    path = Path(root).expanduser() / rel
    refuse_directory(f"quality={name}'s file {rel!r}", path)
    if not path.is_file():
        raise FileNotFoundError(f"quality={name}: {path} not found (data root {root}); {_HOW_TO_SET_ROOT}")
    return path


def _alpaca_eval(path: Path, num_prompts: int, seed: int) -> list[PromptItem]:
    rows = [row for _, _, row in read_rows(path)]
    # two davinci-003 outputs are empty: a prompt without a reference cannot be scored
    usable = [i for i, r in enumerate(rows) if isinstance(r, dict) and str(r.get("output", "")).strip()]
    for i in usable:
        if not isinstance(rows[i].get("instruction"), str) or not rows[i]["instruction"].strip():
            # ids count from 0 (alpaca_eval-000 is entry 1): the message names both
            raise ValueError(f"{path}:entry {i + 1} (id 'alpaca_eval-{i:03d}'): instruction must be non-empty "
                             f"text; is it AlpacaEval's file?")
    if num_prompts > len(usable):
        raise ValueError(f"quality.num_prompts={num_prompts} exceeds alpaca_eval's "
                         f"{len(usable)} usable prompts")
    # drawn, not the first N: the file is grouped by source dataset, so a prefix would cover one or two
    picked = np.random.default_rng(seed).choice(len(usable), size=num_prompts, replace=False)
    # listed in file order, which reads better; the draw alone decides which prompts are in
    return [
        PromptItem(f"alpaca_eval-{i:03d}", rows[i]["instruction"], [rows[i]["output"]],
                   rows[i].get("dataset", ""))
        for i in sorted(usable[j] for j in picked)
    ]


def _self_instruct(path: Path) -> list[PromptItem]:
    items = []
    for where, _, row in read_rows(path):
        try:
            inst = row["instances"][0]
            text = row["instruction"] + ("\n\n" + inst["input"] if inst["input"].strip() else "")
            items.append(PromptItem(row["id"], text, [inst["output"]], row.get("motivation_app", "")))
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            own = row.get("id") if isinstance(row, dict) else None  # the file's own ids count from 0
            named = f" (id {own!r})" if own is not None else ""
            raise ValueError(f"{path}:{where}{named}: not a self-instruct task ({type(e).__name__}: {e}); want "
                             f"id, instruction, instances[0].input and .output") from None
    return items
