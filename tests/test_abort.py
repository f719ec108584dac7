"""The engine's abort API: a request dropped wherever it stands gives its KV blocks back at once."""
from __future__ import annotations

import pytest
from test_scheduler import add, make, step
from test_server import TINY

from optladder.engine.config import EngineConfig
from optladder.engine.llm_engine import LLMEngine
from optladder.engine.sequence import SamplingParams, SeqStatus


@pytest.mark.parametrize("dynamic", [False, True])
def test_abort_a_running_sequence_frees_its_blocks_and_the_rest_finish(dynamic):
    sched = make(dynamic, num_blocks=16, batch_size=3)
    seqs = add(sched, 3, prompt_len=6, max_tokens=8)
    step(sched)  # prefill: all three admitted
    step(sched)
    held = sched.bm.num_free_blocks
    victim = seqs[1]
    blocks = len(victim.block_table)
    assert blocks > 0 and victim in sched.running
    assert sched.abort(victim.request_id) is victim
    assert victim.status == SeqStatus.FINISHED and victim.finish_reason == "abort"
    assert victim not in sched.running and victim.block_table == []
    assert sched.bm.num_free_blocks == held + blocks
    while sched.has_unfinished():
        batch = step(sched)
        assert victim not in (batch.seqs if batch else [])
    assert all(s.num_output_tokens == 8 for s in (seqs[0], seqs[2]))
    assert sched.bm.all_free()


def test_abort_a_waiting_sequence_and_an_unknown_id():
    sched = make(True, num_blocks=4, max_num_seqs=1)
    a, b = add(sched, 2, prompt_len=4, max_tokens=4)
    step(sched)  # a runs, b waits (one seat)
    assert b in sched.waiting and not b.block_table
    assert sched.abort(b.request_id) is b and b not in sched.waiting
    assert sched.abort("no-such-request") is None
    assert sched.abort(b.request_id) is None  # twice: the second finds nothing
    while sched.has_unfinished():
        step(sched)
    assert a.num_output_tokens == 4 and sched.bm.all_free()


def test_abort_a_preempted_sequence():
    # 3 blocks of 4 tokens: two 4-token prompts fit, growth preempts the newest, which then waits
    sched = make(True, num_blocks=3, block_size=4)
    a, b = add(sched, 2, prompt_len=4, max_tokens=8)
    for _ in range(4):
        step(sched)
    assert sched.num_preemptions >= 1
    preempted = next(s for s in (a, b) if s in sched.waiting)
    assert sched.abort(preempted.request_id) is preempted
    while sched.has_unfinished():
        step(sched)
    assert sched.bm.all_free()


@pytest.mark.parametrize("paged", [False, True])
def test_engine_abort_request_mid_decode(paged):
    engine = LLMEngine(TINY, EngineConfig(device="cpu", max_model_len=256, kv_cache_gb=0.05, paged_kv=paged,
                                          dynamic_batching=paged))
    params = SamplingParams(max_tokens=30)
    for i in range(3):
        engine.add_request(f"r{i}", [100 + i] * 20, params)
    seen: dict[str, int] = {}
    while len(seen) < 3 or min(seen.values()) < 3:  # static batching first waits for its batch timeout
        for ev in engine.step():
            seen[ev.request_id] = ev.num_output_tokens
    assert engine.abort_request("r1") and not engine.abort_request("r1")
    while engine.has_unfinished():
        for ev in engine.step():
            assert ev.request_id != "r1"
            seen[ev.request_id] = ev.num_output_tokens
    assert seen["r0"] == seen["r2"] == 30 and seen["r1"] < 30
    assert engine.block_manager.all_free()


def test_abort_request_drops_the_speculators_state_of_the_sequence():
    from optladder.engine.config import SpeculativeConfig

    engine = LLMEngine(TINY, EngineConfig(device="cpu", max_model_len=256, kv_cache_gb=0.05, paged_kv=True,
                                          dynamic_batching=True, speculative=SpeculativeConfig("ngram")))
    for i in range(2):
        engine.add_request(f"r{i}", [100, 101, 102] * 7, SamplingParams(max_tokens=30))
    for _ in range(4):
        engine.step()
    index = engine.speculator.proposer.index
    ids = {s.request_id: s.seq_id for s in engine.scheduler.running}
    assert ids["r1"] in index  # the n-gram index of a sequence that drafted
    assert engine.abort_request("r1")
    assert ids["r1"] not in index and ids["r0"] in index
