"""vLLM's correctness pattern: every lossless switch, alone and all together, gives token-identical greedy
outputs to the baseline, on the tiny model and on SmolLM2 (CPU, float32, the builtin quality prompts
through the chat template). Also: the streamed text is the decoded text, every block returns to the pool,
KV exhaustion preempts without losing a request, and bad settings are refused naming the field.

Each engine is built once per config and model (`runs_of` caches the results), run once, and dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.detokenizer import Detokenizer
from optladder.engine.llm_engine import LLMEngine
from optladder.engine.model_runner import kv_bytes_per_token
from optladder.engine.loader import load_tokenizer, model_shape
from optladder.engine.opts import switch_configs
from optladder.engine.sequence import SamplingParams, Sequence, SeqStatus
from optladder.engine.tokenizer import chat_token_ids
from optladder.quality.prompts import QualityConfig, load_prompt_set

CONF = Path(__file__).resolve().parents[1] / "optladder" / "conf"
CONFIGS = switch_configs()  # baseline, each switch alone (prefix_cache with paged_kv), all on
ALL = CONFIGS["all on"]
TINY_INIT_STD = 0.3
BASE = dict(device="cpu", dtype="float32", max_model_len=256, kv_cache_gb=0.2, batch_size=4, max_num_seqs=16)
# (prompts, max new tokens): SmolLM2 stops at EOS on its own; the tiny model's lengths are staggered so
# sequences retire at different steps and continuous batching really changes the batch composition
SIZES = {"tiny": (16, [8 + (7 * i) % 25 for i in range(16)]), "smollm2_135m": (8, [32] * 8)}


def model_config(name: str) -> ModelConfig:
    cfg = ModelConfig(**OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml")))
    # at its default init_std (0.02) the random model answers every prompt with one token, whatever the
    # context: identical outputs would then prove nothing about attention or the KV cache
    return replace(cfg, init_std=TINY_INIT_STD) if cfg.source == "random" else cfg


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass
class Run:
    token_ids: list[list[int]]
    streamed: list[str]  # what a client saw: the concatenated TokenEvent.text of each request
    decoded: list[str]  # tokenizer.decode(output ids, skip_special_tokens=True)
    all_free: bool
    effective: dict
    memory: dict
    preemptions: int


def run_engine(model_cfg: ModelConfig, prompts: list[list[int]], max_tokens: list[int], **engine_kw) -> Run:
    engine = LLMEngine(model_cfg, EngineConfig(**{**BASE, **engine_kw}))
    seqs = [engine.add_request(f"p{i}", p, SamplingParams(max_tokens=m, ignore_eos=False), arrival_time=0.0)
            for i, (p, m) in enumerate(zip(prompts, max_tokens))]
    streamed = {s.request_id: "" for s in seqs}
    while engine.has_unfinished():
        for ev in engine.step():
            streamed[ev.request_id] += ev.text
    tok = engine.tokenizer
    return Run([s.output_token_ids for s in seqs], [streamed[s.request_id] for s in seqs],
               [tok.decode(s.output_token_ids, skip_special_tokens=True) for s in seqs],
               engine.block_manager.all_free(), engine.opts_effective(), engine.memory_metrics(),
               engine.scheduler.num_preemptions)


class Runs:
    """One run per config, made on first use."""

    def __init__(self, model: str):
        self.model_cfg = model_config(model)
        n, self.max_tokens = SIZES[model]
        tok = load_tokenizer(self.model_cfg)
        self.prompts = [chat_token_ids(tok, it.prompt) for it in load_prompt_set(QualityConfig(num_prompts=n), None)]
        self._runs: dict[str, Run] = {}

    def __getitem__(self, name: str) -> Run:
        if name not in self._runs:
            self._runs[name] = run_engine(self.model_cfg, self.prompts, self.max_tokens, **CONFIGS[name])
        return self._runs[name]


_RUNS: dict[str, Runs] = {}


def runs_of(model: str) -> Runs:
    if model not in _RUNS:
        _RUNS[model] = Runs(model)
    return _RUNS[model]


@pytest.fixture(scope="module", params=[pytest.param("tiny"),
                                        pytest.param("smollm2_135m", marks=pytest.mark.slow)])
def runs(request) -> Runs:
    return runs_of(request.param)


@pytest.mark.parametrize("config", [c for c in CONFIGS if c != "baseline"])
def test_lossless_switch_reproduces_the_baseline_tokens(runs: Runs, config: str) -> None:
    base, run = runs["baseline"], runs[config]
    distinct = {t for out in base.token_ids for t in out}
    assert len(distinct) > 20, "the outputs barely depend on the prompt: equality would prove little"
    for i, (want, got) in enumerate(zip(base.token_ids, run.token_ids)):
        assert got == want, f"prompt {i}: {config} diverges from the baseline"


@pytest.mark.parametrize("config", [c for c in CONFIGS if c != "baseline"])
def test_the_switch_was_really_in_effect(runs: Runs, config: str) -> None:
    # token equality proves nothing if the switch silently did nothing: check each one's evidence
    base, eff = runs["baseline"].effective, runs[config].effective
    on = CONFIGS[config]
    for opt in ("paged_kv", "dynamic_batching", "batched_decode", "flash_attn", "prefix_cache", "chunked_prefill",
                "speculative"):
        assert eff[opt]["on"] == bool(on.get(opt, False)), opt
    if on.get("paged_kv"):  # small blocks, and more of them taken as sequences grew
        assert eff["paged_kv"]["block_size"] == 16
        assert eff["paged_kv"]["blocks_allocated"] > len(runs.prompts)
    if on.get("dynamic_batching"):  # more sequences in a batch than a static batch may hold
        assert max(eff["dynamic_batching"]["batch_sizes_seen"]) > BASE["batch_size"]
    if on.get("batched_decode"):
        assert eff["batched_decode"]["host_copies_per_step"] == 1.0
        assert base["batched_decode"]["host_copies_per_step"] > 1.0
    if on.get("flash_attn"):
        assert eff["flash_attn"]["backend"].startswith("sdpa")
        assert base["flash_attn"]["backend"] == "naive"
    if on.get("prefix_cache"):  # the chat template's system prompt is a shared prefix
        assert eff["prefix_cache"]["hits"] > 0


@pytest.mark.parametrize("config", ["baseline", "batched_decode", "all on"])
def test_streamed_text_is_the_decoded_text(runs: Runs, config: str) -> None:
    run = runs[config]
    assert any(run.decoded)
    assert run.streamed == run.decoded


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_block_is_back_in_the_pool(runs: Runs, config: str) -> None:
    assert runs[config].all_free


def test_paged_kv_reserves_less_and_uses_more_of_it(runs: Runs) -> None:
    contiguous, paged = runs["baseline"].memory, runs["paged_kv"].memory
    assert paged["perf/kv_reserved_gb"] < contiguous["perf/kv_reserved_gb"]
    assert paged["perf/kv_util"] > 2 * contiguous["perf/kv_util"]


# --- KV exhaustion ---

def test_kv_exhaustion_preempts_and_still_completes_every_request() -> None:
    runs = runs_of("tiny")
    # 0.0003 GiB is ~38 blocks of 16 tokens: one max-length sequence fits, the 16 requests together do not
    tight = run_engine(runs.model_cfg, runs.prompts, runs.max_tokens, paged_kv=True, dynamic_batching=True,
                       kv_cache_gb=0.0003)
    assert tight.effective["paged_kv"]["num_blocks"] < 40
    assert tight.preemptions > 0
    assert tight.token_ids == runs["baseline"].token_ids
    assert tight.streamed == tight.decoded  # a recomputed sequence streams no token twice
    assert tight.all_free


# --- chunked prefill: every prompt split across steps, decodes mixed in ---

CHUNKED = dict(paged_kv=True, dynamic_batching=True, chunked_prefill=True, max_num_batched_tokens=16)


@pytest.mark.parametrize("extra", [pytest.param({}, id="alone"),
                                   pytest.param(dict(prefix_cache=True), id="prefix_cache"),
                                   pytest.param(dict(kv_blocks=20), id="preemption"),
                                   pytest.param(ALL, id="all_on")])
def test_chunked_prefill_with_every_prompt_split_reproduces_the_baseline(runs: Runs, extra: dict) -> None:
    if "kv_blocks" in extra:  # 20 blocks of 16 tokens: one max-length sequence fits, all of them together don't
        per_token = kv_bytes_per_token(model_shape(runs.model_cfg), getattr(torch, BASE["dtype"]))
        extra = dict(kv_cache_gb=extra["kv_blocks"] * 16 * per_token / 2**30)
    run = run_engine(runs.model_cfg, runs.prompts, runs.max_tokens, **{**extra, **CHUNKED})
    assert run.token_ids == runs["baseline"].token_ids
    eff = run.effective["chunked_prefill"]
    assert min(map(len, runs.prompts)) > CHUNKED["max_num_batched_tokens"]
    assert eff["on"] and eff["prompts_split"] >= len(runs.prompts) and eff["mixed_steps"] > 0
    assert run.streamed == run.decoded and run.all_free
    if "kv_cache_gb" in extra:
        assert run.preemptions > 0
    if extra.get("prefix_cache"):  # the chat template's system prompt, shared chunk by chunk
        assert run.effective["prefix_cache"]["hits"] > 0


# --- detokenization ---

def test_a_generation_cut_mid_character_streams_what_decode_shows() -> None:
    tok = load_tokenizer(model_config("tiny"))
    emoji = tok.encode("😀", add_special_tokens=False)
    assert len(emoji) > 1 and tok.decode(emoji[:1]) == "\ufffd"  # a byte-level piece of one character
    output = tok.encode(" ok", add_special_tokens=False) + emoji[:1]  # max_tokens ends it mid-character
    for batched in (False, True):
        seq = Sequence("r", tok.encode("Say hi", add_special_tokens=False), SamplingParams(max_tokens=len(output)))
        det, streamed = Detokenizer(tok, batched), ""
        for t in output:
            seq.append_token(t)
            if seq.num_output_tokens == seq.params.max_tokens:
                seq.status = SeqStatus.FINISHED
            streamed += det.update([seq])[0]
        assert seq.is_finished
        assert streamed == seq.output_text == tok.decode(seq.output_token_ids, skip_special_tokens=True)


# --- bad settings are refused, naming the field ---

@pytest.mark.parametrize("kw, field", [
    (dict(block_size=12), "engine.block_size"),
    (dict(block_size=0), "engine.block_size"),
    (dict(paged_kv=True, kv_cache_gb=1e-5), "engine.kv_cache_gb"),
    (dict(kv_cache_gb=1e-5), "engine.kv_cache_gb"),
    (dict(dynamic_batching=True, max_num_seqs=16, max_num_batched_tokens=8), "engine.max_num_batched_tokens"),
    (dict(prefix_cache=True), "prefix_cache needs paged_kv"),
    (dict(cuda_graphs=True), "cuda_graphs runs on CUDA only"),
    (dict(chunked_prefill=True), r"chunked_prefill needs paged_kv: use '\+opt=\[paged_kv,chunked_prefill\]'"),
    (dict(paged_kv=True, chunked_prefill=True), "chunked_prefill needs dynamic_batching"),
    (dict(fused_kernels=True), "fused_kernels runs on CUDA only"),
    (dict(skinny_gemm=True), "skinny_gemm needs fused_kernels"),
])
def test_bad_settings_are_refused_naming_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LLMEngine(model_config("tiny"), EngineConfig(**{**BASE, **kw}))


def test_reset_stats_leaves_the_warmup_out_of_the_counters() -> None:
    runs = runs_of("tiny")
    engine = LLMEngine(runs.model_cfg, EngineConfig(**{**BASE, **ALL, "kv_cache_gb": 0.0003}))
    engine.generate(runs.prompts, SamplingParams(max_tokens=24))
    assert engine.scheduler.num_preemptions > 0 and engine.block_manager.prefix_hits > 0
    engine.reset_stats()
    eff = engine.opts_effective()
    assert engine.stage_metrics().get("perf/preemptions") == 0.0
    assert eff["prefix_cache"]["hits"] == eff["prefix_cache"]["queries"] == 0
    assert eff["dynamic_batching"]["batch_sizes_seen"] == {} and eff["paged_kv"]["blocks_allocated"] == 0
