"""Fail fast: every file a run reads (model files, trace, prompt set) is loaded and checked, and the engine's
settings are refused where they cannot run, before an engine starts or a request is sent. A broken prompt
set then costs seconds, not a whole replay. What is loaded here is what the run uses: the requests and the
tokenized quality prompts are built once.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optladder.engine.loader import load_tokenizer, model_shape, resolve_device
from optladder.engine.tokenizer import chat_token_ids
from optladder.engine.validation import validate_engine
from optladder.experiments.errors import as_user_error
from optladder.quality.item import PromptItem
from optladder.quality.prompts import load_prompt_set, resolve_max_new_tokens
from optladder.quality.user_sets import read_user_set
from optladder.traffic.load_levels import validate_levels
from optladder.traffic.workload import Workload, build_workload

log = logging.getLogger(__name__)
PROFILED_ENGINES = ("reference", "hf")  # in this process, stepped by the replay driver


@dataclass
class Prepared:
    """What a run replays and scores, loaded and checked."""

    tokenizer: Any
    workload: Workload
    items: list[PromptItem]
    prompt_ids: list[list[int]]  # each prompt through the model's chat template
    max_new_tokens: int  # quality.max_new_tokens with `auto` resolved
    warnings: list[str] = field(default_factory=list)
    quality_skipped: int = 0  # rows of a user's prompt set left out by quality.on_bad_row=skip


def prepare(conf) -> Prepared:
    """conf: the run's Config dataclass. Raises UserError naming the file, line or setting at fault."""
    t0 = time.perf_counter()
    with as_user_error():
        if conf.engine.name == "reference":  # the other engines check their settings where they start
            validate_engine(conf.engine, resolve_device(conf.engine.device).type)
        vllm = check_vllm_install(conf.engine) if conf.engine.name == "vllm" else None  # first: it costs 0.1 s
        validate_levels(list(conf.replay.load_levels), conf.workload.arrival)
        if conf.profile is not None and (conf.engine.name not in PROFILED_ENGINES or conf.replay.driver != "inprocess"):
            raise ValueError(f"+profile={conf.profile.name} traces an engine in this process: engine="
                             f"{'|'.join(PROFILED_ENGINES)} with replay.driver=inprocess, not engine="
                             f"{conf.engine.name} with replay.driver={conf.replay.driver}")
        items = load_prompt_set(conf.quality, conf.data.root)  # first: it needs no tokenizer
        skipped = skipped_rows(conf.quality)
        shape = model_shape(conf.model)  # the model's files: config.json read (a packaged model converted once)
        if vllm is not None:  # what that vLLM cannot run on this device and model, before a server starts
            from optladder.backends.vllm_env import check_switches

            check_switches(conf.engine, shape.head_dim, resolve_device(conf.engine.device).type, vllm.version)
        tokenizer = load_tokenizer(conf.model)
        workload = build_workload(conf.workload, tokenizer, conf.engine.max_model_len, conf.data.root)
        prompt_ids = [chat_token_ids(tokenizer, it.chat()) for it in items]
        max_new = resolve_max_new_tokens(conf.quality, items, tokenizer)
    warnings = [f"workload: {w}" for w in workload.warnings]
    too_long = sum(len(p) >= conf.engine.max_model_len for p in prompt_ids)
    if too_long:
        warnings.append(f"quality: {too_long} of {len(items)} prompts reach engine.max_model_len="
                        f"{conf.engine.max_model_len} through the chat template; they get no answer and score 0")
    for w in warnings:
        log.warning(w)
    log.info("data checked in %.1f s: %d requests (%s), %d quality prompts, max_new_tokens %d",
             time.perf_counter() - t0, len(workload.requests), workload.source, len(items), max_new)
    return Prepared(tokenizer, workload, items, prompt_ids, max_new, warnings, skipped)


def check_vllm_install(engine):
    """engine=vllm: the interpreter that will run `vllm serve` finds vLLM, or a one-line ValueError saying how
    to get it, before any data loads or server starts (not, minutes later, the server's ModuleNotFoundError)."""
    from optladder.backends.vllm_env import check_install, probe
    from optladder.backends.vllm_server import VLLM_VENV_PYTHON, vllm_python

    install = probe(vllm_python(engine.server), engine.server.env)
    check_install(install, engine.server, str(VLLM_VENV_PYTHON))
    return install


def skipped_rows(quality) -> int:
    """How many rows of a user's prompt set quality.on_bad_row=skip left out (0 for every other set or setting):
    the set is read again, as load_prompt_set counts them without returning the count."""
    if quality.name != "jsonl" or quality.on_bad_row != "skip":
        return 0
    return read_user_set(Path(quality.path).expanduser(), "skip")[1]
