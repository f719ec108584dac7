"""Prompt sets for the quality check: the built-in set, AlpacaEval, self-instruct, or a user's jsonl.

Every set becomes a list of `PromptItem`s in a fixed order, so both arms of an A/B see the same
prompts; `prompts_digest` proves it. External sets are read from a data root (config key `data.root`
or env `OPTLADDER_DATA`), never bundled: only the built-in set ships with the code.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

PROMPT_SETS = ("builtin", "alpaca_eval", "self_instruct", "jsonl")
BUILTIN_PATH = Path(__file__).with_name("builtin_prompts.jsonl")
ALPACA_EVAL_FILE = "prompts/alpaca_eval_davinci003.json"
SELF_INSTRUCT_FILE = "prompts/self_instruct_user_oriented.jsonl"
_HOW_TO_SET_ROOT = "set the config key data.root=/path/to/data or the environment variable OPTLADDER_DATA"


@dataclass
class PromptItem:
    id: str
    prompt: str
    references: list[str]
    task: str = ""


@dataclass
class QualityConfig:
    """Which prompt set, how many prompts, and how long the greedy answers may be."""

    name: str = "builtin"
    num_prompts: int = 200
    max_new_tokens: int = 64
    seed: int = 0  # alpaca_eval's draw
    path: Optional[str] = None  # name=jsonl: the user's file
    review_prompts: int = 50  # rows of the human-review HTML of an A/B

    def __post_init__(self) -> None:
        if self.name not in PROMPT_SETS:
            raise ValueError(f"quality.name={self.name!r} is not a prompt set; "
                             f"valid: {', '.join(PROMPT_SETS)}")
        for key in ("num_prompts", "max_new_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"quality.{key} must be >= 1, got {getattr(self, key)}")
        if self.review_prompts < 0:
            raise ValueError(f"quality.review_prompts must be >= 0, got {self.review_prompts}")
        if self.name == "jsonl" and not self.path:
            raise ValueError("quality.name='jsonl' needs quality.path: a jsonl of id, prompt, references")


def load_prompt_set(cfg: QualityConfig, data_root: str | None) -> list[PromptItem]:
    """The prompts of `cfg.name` in a deterministic order; a None data_root falls back to $OPTLADDER_DATA."""
    if cfg.name == "builtin":
        items = read_jsonl_set(BUILTIN_PATH)
        if cfg.num_prompts > len(items):
            raise ValueError(f"quality.num_prompts={cfg.num_prompts} exceeds the builtin set's "
                             f"{len(items)} prompts")
        return items[: cfg.num_prompts]
    if cfg.name == "jsonl":
        return read_jsonl_set(Path(cfg.path).expanduser())[: cfg.num_prompts]
    if cfg.name == "alpaca_eval":
        return _alpaca_eval(_data_file(data_root, ALPACA_EVAL_FILE, cfg.name), cfg.num_prompts, cfg.seed)
    if cfg.name == "self_instruct":
        return _self_instruct(_data_file(data_root, SELF_INSTRUCT_FILE, cfg.name))[: cfg.num_prompts]
    raise ValueError(f"quality.name={cfg.name!r} is not a prompt set; valid: {', '.join(PROMPT_SETS)}")


def prompts_digest(items: list[PromptItem]) -> str:
    """sha256 over ids, prompts and references, in order: equal digests mean identical prompt sets."""
    canon = json.dumps([[it.id, it.prompt, it.references] for it in items],
                       ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def read_jsonl_set(path: Path) -> list[PromptItem]:
    """A file in the built-in format: one {"id", "prompt", "references", "task"?} object per line."""
    if not path.is_file():
        raise FileNotFoundError(f"prompt set not found: {path}")
    items, seen = [], set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        refs = row.get("references")
        refs_ok = isinstance(refs, list) and refs and all(isinstance(r, str) and r for r in refs)
        if not row.get("id") or not row.get("prompt") or not refs_ok:
            raise ValueError(f"{path}:{lineno}: each line needs a non-empty id, prompt and references "
                             f"(a list of non-empty strings); got keys {sorted(row)}")
        if row["id"] in seen:
            raise ValueError(f"{path}:{lineno}: duplicate id {row['id']!r}")
        seen.add(row["id"])
        items.append(PromptItem(str(row["id"]), row["prompt"], refs, row.get("task", "")))
    return items


def _data_file(data_root: str | None, rel: str, name: str) -> Path:
    root = data_root or os.environ.get("OPTLADDER_DATA")
    if not root:
        raise FileNotFoundError(f"quality={name} reads {rel} under a data root, and none is set: "
                                f"{_HOW_TO_SET_ROOT}")
    path = Path(root).expanduser() / rel
    if not path.is_file():
        raise FileNotFoundError(f"quality={name}: {path} not found (data root {root}); {_HOW_TO_SET_ROOT}")
    return path


def _alpaca_eval(path: Path, num_prompts: int, seed: int) -> list[PromptItem]:
    rows = json.loads(path.read_text(encoding="utf-8"))
    # two davinci-003 outputs are empty: a prompt without a reference cannot be scored
    usable = [i for i, r in enumerate(rows) if r.get("output", "").strip()]
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
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        inst = row["instances"][0]
        text = row["instruction"] + ("\n\n" + inst["input"] if inst["input"].strip() else "")
        items.append(PromptItem(row["id"], text, [inst["output"]], row.get("motivation_app", "")))
    return items
