"""Speculative decoding: the draft slots' bookkeeping (no torch), the n-gram lookup, greedy acceptance and
rejection sampling, and the engine's greedy outputs against the baseline's for both methods, with every CPU
switch, under preemption and with every prompt split; bad settings refused before weights load.

Besides the real proposers, an oracle proposer drafts the baseline's own next tokens with every third one
wrong: most drafts are accepted, runs of them cross block boundaries, and each step rejects some, which the
real proposers on the random tiny model rarely do (its outputs seldom repeat)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from optladder.engine.block_manager import BlockManager
from optladder.engine.config import EngineConfig, SpeculativeConfig
from optladder.engine.llm_engine import LLMEngine
from optladder.engine.model_runner import draw
from optladder.engine.scheduler import Scheduler
from optladder.engine.sequence import SamplingParams, Sequence
from optladder.engine.speculative import NgramProposer, Speculator
from tests.conftest import compose_config
from tests.test_engine_equivalence import ALL, BASE, model_config, runs_of

NGRAM = SpeculativeConfig("ngram", num_draft_tokens=4)
LAYERS = SpeculativeConfig("draft_layers", num_draft_tokens=3, num_draft_layers=1)  # the tiny model has 2


# --- bookkeeping: draft slots come from free blocks and go back exactly ---

def spec_scheduler(num_blocks: int, block_size: int = 4, spec=NGRAM, **kw) -> Scheduler:
    cfg = EngineConfig(dynamic_batching=True, max_model_len=256, **kw)
    return Scheduler(cfg, BlockManager(num_blocks, block_size, enable_prefix_cache=True), speculative=spec)


def decoding(sched: Scheduler, prompt: list[int], max_tokens: int = 32) -> Sequence:
    """A sequence whose prompt step has run: it decodes next."""
    seq = Sequence(f"r{prompt[0]}", prompt, SamplingParams(max_tokens=max_tokens))
    sched.add(seq)
    batch = sched.schedule(0.0)
    sched.postprocess(batch, [[100]])
    return seq


def layout(bm: BlockManager, seq: Sequence) -> tuple[int, list[int], int]:
    return len(seq.block_table), [bm.blocks[b].num_tokens for b in seq.block_table], bm.used_tokens


def test_rejected_drafts_slots_are_rolled_back_to_what_one_token_steps_build() -> None:
    sched = spec_scheduler(num_blocks=20)
    seq = decoding(sched, list(range(1, 10)))  # 9 prompt tokens + 1: computes position 9 next
    batch = sched.schedule(0.0)
    assert batch.lookahead == [4] and len(seq.block_table) == 4  # positions 9..13 need blocks up to 16 slots
    free_before, draft_block = list(sched.bm.free_block_ids), seq.block_table[3]
    batch.drafts[0] = [7, 8, 9, 10]
    sched.postprocess(batch, [[7, 8, 11]])  # two drafts accepted, the model's own token after them
    assert seq.token_ids[-4:] == [100, 7, 8, 11] and seq.num_computed_tokens == len(seq) - 1 == 12
    # the same tokens, one step each, without speculation
    ref_sched = spec_scheduler(num_blocks=20, spec=None)
    ref = decoding(ref_sched, list(range(1, 10)))
    for tok in (7, 8, 11):
        ref_sched.postprocess(ref_sched.schedule(0.0), [tok])
    assert layout(sched.bm, seq) == layout(ref_sched.bm, ref) == (3, [4, 4, 4], 12)
    # the block taken for the rejected drafts is first in line again, ahead of any cached prefix
    assert list(sched.bm.free_block_ids) == [draft_block, *free_before]


def test_blocks_of_accepted_drafts_are_registered_and_blocks_with_rejected_ones_never() -> None:
    sched = spec_scheduler(num_blocks=20)
    seq = decoding(sched, list(range(1, 8)))  # 8 tokens: position 7 next, block 1 fills with it
    batch = sched.schedule(0.0)
    registered = set(sched.bm.hash_to_block.values())
    assert seq.block_table[1] in registered  # written by this step: its newest token completes it
    batch.drafts[0] = [20, 21, 22, 23]  # positions 8..11: block 2
    sched.postprocess(batch, [[20, 21, 99]])  # 22 and 23 rejected: block 2 holds their KV
    assert seq.block_table[2] not in set(sched.bm.hash_to_block.values())
    batch = sched.schedule(0.0)
    batch.drafts[0] = [30, 31, 32, 33]  # positions 11..14
    sched.postprocess(batch, [[30, 31, 32, 33, 34]])  # all accepted: block 2 now holds only verified tokens
    b2 = sched.bm.blocks[seq.block_table[2]]
    assert sched.bm.hash_to_block[b2.hash] == b2.block_id and b2.token_ids == tuple(seq.token_ids[8:12])
    assert seq.num_computed_tokens == 15 and len(seq.block_table) == 4


def test_drafts_get_what_is_free_after_every_decode_has_its_slot_and_never_preempt() -> None:
    sched = spec_scheduler(num_blocks=5)
    a, b = decoding(sched, list(range(1, 8))), decoding(sched, list(range(11, 19)))
    assert (len(a), len(b), sched.bm.num_free_blocks) == (8, 9, 1)  # 2 blocks each, one free
    batch = sched.schedule(0.0)
    # b's newest token (position 8) needs the free block, and gets it although a comes first; a's drafts would
    # need a block too and get none; b's drafts fill the rest of its new block (positions 9..11)
    assert batch.seqs == [a, b] and batch.lookahead == [0, 3] and sched.num_preemptions == 0


def test_draft_slots_stop_at_what_the_request_still_wants_and_at_the_token_budget() -> None:
    sched = spec_scheduler(num_blocks=20)
    decoding(sched, list(range(1, 8)), max_tokens=3)  # one output token so far, two more wanted
    assert sched.schedule(0.0).lookahead == [1]
    chunked = spec_scheduler(num_blocks=40, paged_kv=True, chunked_prefill=True, max_num_seqs=2,
                             max_num_batched_tokens=3)
    chunked.add(Sequence("a", list(range(1, 4)), SamplingParams(max_tokens=32)))
    chunked.postprocess(chunked.schedule(0.0), [[5]])
    assert chunked.schedule(0.0).lookahead == [2]  # 1 token and 2 drafts fill the budget of 3


def test_disable_by_batch_size_stops_speculating_in_a_busy_step() -> None:
    sched = spec_scheduler(num_blocks=40, spec=replace(NGRAM, disable_by_batch_size=1))
    decoding(sched, list(range(1, 8)))
    assert sched.schedule(0.0).lookahead == [4]
    sched2 = spec_scheduler(num_blocks=40, spec=replace(NGRAM, disable_by_batch_size=1))
    decoding(sched2, list(range(1, 8)))
    decoding(sched2, list(range(11, 18)))
    assert sched2.schedule(0.0).lookahead == [0, 0]


# --- proposing and accepting ---

def ngram(tokens: list[int], k: int = 4, lo: int = 1, hi: int = 3) -> list[int]:
    seq = Sequence("r", tokens, SamplingParams())
    return NgramProposer(SpeculativeConfig("ngram", ngram_min=lo, ngram_max=hi)).propose(seq, k)


def test_ngram_drafts_what_followed_the_latest_longest_match() -> None:
    assert ngram([1, 2, 3, 4, 9, 1, 2, 3]) == [4, 9, 1, 2]
    # (1, 2) is followed by 8, then later by 9: the latest wins
    assert ngram([5, 1, 2, 8, 6, 1, 2, 9, 7, 1, 2], hi=2) == [9, 7, 1, 2]
    # a 3-token match beats a later 1-token one
    assert ngram([4, 5, 6, 70, 71, 6, 80, 4, 5, 6], k=2) == [70, 71]
    # a repeat runs past the end of the context into the drafts themselves
    assert ngram([9, 1, 2, 1, 2], k=5, hi=2) == [1, 2, 1, 2, 1]
    assert ngram([1, 2, 3, 4], lo=1) == []


def test_ngram_index_grows_with_the_sequence_like_a_fresh_one() -> None:
    prop = NgramProposer(SpeculativeConfig("ngram", ngram_min=1, ngram_max=3))
    seq = Sequence("r", [3, 1, 4, 1, 5, 9, 2, 6], SamplingParams())
    for tok in [5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]:
        assert prop.propose(seq, 3) == ngram(seq.token_ids, k=3)
        seq.append_token(tok)


def test_greedy_acceptance_keeps_the_drafts_up_to_the_first_miss_and_the_models_token_there() -> None:
    spec = Speculator(NGRAM, runner=None)
    out = spec.accept([[5, 6, 7], [], [1]], [5, 6, 8, 9, 4, 2, 3])
    assert out == [[5, 6, 8], [4], [2]]
    assert (spec.proposed, spec.accepted, spec.verifications) == (4, 2, 2)


def test_rejection_sampling_leaves_the_distribution_unchanged() -> None:
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    gen = torch.Generator().manual_seed(0)
    n = 8000
    for draft in (0, 3):  # a likely draft, a rare one: always keeping the draft would give it 1.0
        counts = torch.bincount(torch.stack([draw(p, gen, draft) for _ in range(n)]), minlength=4)
        assert torch.allclose(counts / n, p, atol=0.02), (draft, counts / n)


# --- the engine: the baseline's exact tokens ---

class Oracle:
    """Drafts the baseline's next tokens, every third one wrong."""

    def __init__(self, runs, prompts):
        self.want = {tuple(p): o for p, o in zip(prompts, runs["baseline"].token_ids)}

    def propose_rows(self, seqs, ks):
        out = []
        for seq, k in zip(seqs, ks):
            done = seq.num_output_tokens
            nxt = self.want[tuple(seq.token_ids[:seq.num_prompt_tokens])][done:done + k]
            out.append([t if (done + j) % 3 else t + 1 for j, t in enumerate(nxt)])
        return out

    def release(self, seq):
        pass


def check_blocks(engine: LLMEngine) -> None:
    """After every step: each decoding sequence holds exactly the blocks its computed tokens need, and every
    block registered for prefix reuse holds computed tokens only, the ones its hash says."""
    bm = engine.block_manager
    for seq in engine.scheduler.running:
        if seq.num_computed_tokens != len(seq) - 1:
            continue
        assert len(seq.block_table) == -(-seq.num_computed_tokens // bm.block_size)
        for i, b in enumerate(seq.block_table):
            if bm.blocks[b].hash != -1 and bm.hash_to_block.get(bm.blocks[b].hash) == b:
                assert (i + 1) * bm.block_size <= seq.num_computed_tokens
                assert bm.blocks[b].token_ids == tuple(seq.block_tokens(i, bm.block_size))


def run_checked(runs, prompts, proposer=None, temperature=0.0, **engine_kw) -> tuple[list[list[int]], LLMEngine]:
    engine = LLMEngine(runs.model_cfg, EngineConfig(**{**BASE, **engine_kw}))
    if proposer is not None:
        engine.speculator.proposer = proposer
    seqs = [engine.add_request(f"p{i}", p, SamplingParams(max_tokens=m, ignore_eos=False, temperature=temperature,
                                                          seed=i), arrival_time=0.0)
            for i, (p, m) in enumerate(zip(prompts, runs.max_tokens))]
    while engine.has_unfinished():
        engine.step()
        check_blocks(engine)
    assert engine.block_manager.all_free()
    return [s.output_token_ids for s in seqs], engine


ORACLE_SETTINGS = {
    "contiguous_static": dict(),
    "all_on_preemption": {**ALL, "kv_cache_gb": 0.0003},
    "chunked_budget_16": {**ALL, "max_num_batched_tokens": 16},
}


@pytest.fixture(scope="module")
def tiny():
    return runs_of("tiny")


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("setting", list(ORACLE_SETTINGS))
def test_verified_drafts_reproduce_the_baseline_with_exact_kv_bookkeeping(tiny, setting) -> None:
    kw = {**ORACLE_SETTINGS[setting], "speculative": NGRAM}
    got, engine = run_checked(tiny, tiny.prompts, Oracle(tiny, tiny.prompts), **kw)
    assert got == tiny["baseline"].token_ids
    ev = engine.opts_effective()["speculative"]
    assert ev["drafts_accepted"] > ev["verifications"] and ev["drafts_accepted"] < ev["drafts_proposed"]
    if "kv_cache_gb" in kw:
        assert engine.scheduler.num_preemptions > 0
    if kw.get("prefix_cache"):
        assert engine.block_manager.prefix_hits > 0


@pytest.mark.usefixtures("one_torch_thread")
def test_the_first_layers_draft_reproduces_the_baseline_with_every_switch_and_preemption(tiny) -> None:
    kw = {**ALL, "speculative": LAYERS, "kv_cache_gb": 0.00016, "max_num_batched_tokens": 16}
    got, engine = run_checked(tiny, tiny.prompts, **kw)
    assert got == tiny["baseline"].token_ids
    ev = engine.opts_effective()["speculative"]
    assert ev["method"] == "draft_layers" and ev["draft_passes"] > 0 and ev["drafts_accepted"] > 0
    assert engine.scheduler.num_preemptions > 0
    assert engine.stage_metrics()["stage/draft_count"] > 0 and "stage/verify_ms_mean" in engine.stage_metrics()


@pytest.mark.usefixtures("one_torch_thread")
def test_sampling_with_drafts_runs_rejection_sampling_and_frees_everything(tiny) -> None:
    prompts = tiny.prompts[:4]
    got, engine = run_checked(tiny, prompts, Oracle(tiny, prompts), temperature=0.2,
                              **{**ALL, "speculative": NGRAM})
    ev = engine.opts_effective()["speculative"]
    assert all(0 < len(o) <= m for o, m in zip(got, tiny.max_tokens))
    assert 0 < ev["drafts_accepted"] < ev["drafts_proposed"]


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_ngram_on_smollm2_repeat_heavy_prompts_is_exact_and_accepts_most_drafts() -> None:
    from pathlib import Path

    from optladder.engine.tokenizer import chat_token_ids
    from optladder.quality.user_sets import read_user_set

    cfg = model_config("smollm2_135m")
    items, _ = read_user_set(Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "rewrite_prompts.jsonl")
    outs = {}
    for name, spec in (("baseline", SpeculativeConfig()), ("ngram", NGRAM)):
        engine = LLMEngine(cfg, EngineConfig(**{**BASE, "paged_kv": True, "speculative": spec}))
        prompts = [chat_token_ids(engine.tokenizer, it.chat()) for it in items[:3]]
        seqs = engine.generate(prompts, SamplingParams(max_tokens=48, ignore_eos=False))
        outs[name] = [s.output_token_ids for s in seqs]
        ev = engine.opts_effective()["speculative"]
    assert outs["ngram"] == outs["baseline"]
    assert ev["acceptance_rate"] > 0.3 and ev["tokens_per_verification"] > 1.5


# --- bad settings, refused before a weight loads ---

@pytest.mark.parametrize("kw, message", [
    (dict(method="medusa"), r"engine.speculative.method='medusa' is not one of \['none', 'ngram', 'draft_layers'\]"),
    (dict(method="ngram", num_draft_tokens=0), "engine.speculative.num_draft_tokens must be >= 1, got 0"),
    (dict(method="ngram", ngram_min=3, ngram_max=2), "engine.speculative.ngram_max=2 must be >= .*ngram_min=3"),
    (dict(method="ngram", disable_by_batch_size=0), "engine.speculative.disable_by_batch_size must be >= 1"),
])
def test_bad_speculative_settings_fail_when_the_config_is_built(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig(**kw)
    overrides = [f"engine.speculative.{k}={v}" for k, v in kw.items()]
    with pytest.raises(ValueError, match=message):
        OmegaConf.to_object(compose_config(overrides))


@pytest.mark.parametrize("spec, message", [
    (SpeculativeConfig("ngram", num_draft_tokens=255), r"num_draft_tokens=255 does not fit .*max_model_len=256.*1..254"),
    (SpeculativeConfig("draft_layers", num_draft_layers=2), r"num_draft_layers=2: .*fewer layers than the model's 2.*1..1"),
])
def test_settings_the_model_or_context_cannot_take_are_refused_before_weights_load(monkeypatch, spec, message):
    import optladder.engine.llm_engine as llm_engine

    def no_weights(*a, **k):
        raise AssertionError("weights were loaded before the settings were checked")

    monkeypatch.setattr(llm_engine, "load_model", no_weights)
    with pytest.raises(ValueError, match=message):
        LLMEngine(model_config("tiny"), EngineConfig(**{**BASE, "speculative": spec}))


def test_the_ab_config_is_a_lossless_candidate_and_a_lossy_change_beside_it_is_not() -> None:
    from optladder.abtest.lossless import arms_lossless

    def resolved(overrides):
        return OmegaConf.to_container(compose_config(overrides), resolve=True)

    ab = compose_config(["+ab=speculative"]).ab
    control, candidate = resolved(list(ab.control)), resolved(list(ab.candidate))
    assert candidate["engine"]["speculative"]["method"] == "ngram"
    assert arms_lossless(control, candidate)[0]
    assert arms_lossless(control, resolved([*ab.candidate, "engine.speculative.method=draft_layers"]))[0]
    lossy = arms_lossless(control, resolved([*ab.candidate, "engine.dtype=bfloat16"]))
    assert not lossy[0] and "engine.dtype" in lossy[1]
