"""Static, continuous and chunked batching, admission under a KV budget, preemption and starvation,
without a model.

A step is simulated the way the engine runs it: schedule(now) -> (no forward pass) -> postprocess with
fake token ids. Fake tokens are distinct per position so a recomputed sequence is visibly the same one.
"""
from __future__ import annotations

import pytest

from optladder.engine.block_manager import BlockManager
from optladder.engine.config import EngineConfig
from optladder.engine.scheduler import Batch, Scheduler
from optladder.engine.sequence import SamplingParams, Sequence, SeqStatus

MAX_LEN = 64


def config(dynamic: bool, **kw) -> EngineConfig:
    return EngineConfig(dynamic_batching=dynamic, max_model_len=MAX_LEN, **kw)


def make(dynamic: bool, num_blocks: int, block_size: int = 4, **kw) -> Scheduler:
    return Scheduler(config(dynamic, **kw), BlockManager(num_blocks, block_size))


def add(sched: Scheduler, n: int, prompt_len: int = 4, max_tokens: int = 4, t: float = 0.0) -> list[Sequence]:
    seqs = []
    for i in range(n):
        s = Sequence(f"r{len(sched.waiting) + len(sched.running)}-{i}", [10 + i] * prompt_len,
                     SamplingParams(max_tokens=max_tokens), arrival_time=t)
        sched.add(s)
        seqs.append(s)
    return seqs


def step(sched: Scheduler, now: float = 1e9):
    batch = sched.schedule(now)
    if batch is not None:
        sched.postprocess(batch, [1000 + len(s) for s in batch.sampled_seqs])
    return batch


def run_all(sched: Scheduler, max_steps: int = 10_000) -> int:
    steps = 0
    while sched.has_unfinished():
        step(sched)
        steps += 1
        assert steps < max_steps, "no progress: a request is starved"
    return steps


# --- static batching (dynamic_batching off) ---

def test_static_waits_for_a_full_batch_or_the_timeout() -> None:
    sched = make(False, num_blocks=64, batch_size=4, batch_timeout_ms=50)
    add(sched, 3, t=1.0)
    assert sched.schedule(now=1.01) is None
    assert sched.next_deadline() == 1.05
    batch = sched.schedule(now=1.06)
    assert batch is not None and batch.is_prefill and len(batch.seqs) == 3


def test_static_releases_a_full_batch_at_once_and_no_larger() -> None:
    sched = make(False, num_blocks=64, batch_size=4, batch_timeout_ms=10000)
    seqs = add(sched, 6, t=1.0)
    batch = sched.schedule(now=1.0)
    assert batch is not None and batch.seqs == seqs[:4]
    assert list(sched.waiting) == seqs[4:]


def test_static_runs_a_batch_to_completion_before_admitting_more() -> None:
    sched = make(False, num_blocks=64, batch_size=2, batch_timeout_ms=0)
    first = add(sched, 2, max_tokens=5)
    step(sched)
    late = add(sched, 2, max_tokens=5)
    for _ in range(4):  # four decode steps finish the first batch; the late pair only waits
        batch = step(sched)
        assert not batch.is_prefill and batch.seqs == first
        assert all(s.status == SeqStatus.WAITING for s in late)
    assert all(s.is_finished for s in first)
    batch = step(sched)
    assert batch.is_prefill and batch.seqs == late


def test_static_batch_is_capped_by_the_kv_budget() -> None:
    # contiguous: one block of max_model_len per sequence, 3 blocks -> 3 sequences, whatever batch_size says
    sched = Scheduler(config(False, batch_size=8),
                      BlockManager(3, MAX_LEN))
    add(sched, 8)
    assert len(sched.schedule(now=1e9).seqs) == 3


# --- continuous batching (dynamic_batching on) ---

def test_continuous_admits_up_to_max_num_seqs_in_one_step() -> None:
    sched = make(True, num_blocks=256, max_num_seqs=16)
    add(sched, 20)
    batch = sched.schedule(now=0.0)
    assert len(batch.seqs) == 16 and len(sched.running) == 16 and len(sched.waiting) == 4


def test_continuous_fills_free_seats_at_the_next_step() -> None:
    sched = make(True, num_blocks=256, max_num_seqs=4)
    first = add(sched, 3, max_tokens=8)
    step(sched)
    late = add(sched, 3, max_tokens=8)
    batch = step(sched)  # new arrivals join while the first three are mid-generation
    assert batch.is_prefill and batch.seqs == late[:1]
    assert sched.running == first + late[:1]
    batch = step(sched)
    assert not batch.is_prefill and batch.seqs == first + late[:1]


def test_continuous_respects_max_num_batched_tokens() -> None:
    sched = make(True, num_blocks=256, max_num_seqs=16, max_num_batched_tokens=250)
    add(sched, 4, prompt_len=100)
    assert len(step(sched).seqs) == 2
    assert len(step(sched).seqs) == 2  # the rest come at the next step, not never


def test_a_prompt_longer_than_the_token_budget_still_runs_alone() -> None:
    sched = make(True, num_blocks=256, max_num_seqs=16, max_num_batched_tokens=32)
    long, short = add(sched, 1, prompt_len=40)[0], add(sched, 1, prompt_len=4)[0]
    assert step(sched).seqs == [long]
    assert step(sched).seqs == [short]


def test_continuous_retires_finished_sequences_at_once() -> None:
    sched = make(True, num_blocks=64, max_num_seqs=8)
    short, long = add(sched, 1, max_tokens=2)[0], add(sched, 1, max_tokens=6)[0]
    step(sched)  # prefill: first token each
    step(sched)  # short's second token: done
    assert short.is_finished and short.finish_reason == "length" and short.block_table == []
    assert sched.running == [long]
    assert sched.bm.used_tokens == len(long) - 1  # the newest token's KV is written by the next step


def test_admission_is_fcfs_even_when_a_later_request_would_fit() -> None:
    sched = make(True, num_blocks=4, max_num_seqs=8)
    add(sched, 1, prompt_len=8, max_tokens=20)  # 2 blocks
    big, small = add(sched, 1, prompt_len=12)[0], add(sched, 1, prompt_len=4)[0]
    batch = step(sched)
    assert len(batch.seqs) == 1 and big.status == small.status == SeqStatus.WAITING
    assert list(sched.waiting) == [big, small]


def test_paged_admits_more_sequences_than_contiguous_under_the_same_budget() -> None:
    budget_tokens, prompt_len = 4 * MAX_LEN, 12
    admitted = {}
    for name, bs in (("contiguous", MAX_LEN), ("paged", 4)):
        sched = Scheduler(config(True, max_num_seqs=64),
                          BlockManager(budget_tokens // bs, bs))
        add(sched, 40, prompt_len=prompt_len)
        admitted[name] = len(sched.schedule(now=0.0).seqs)
    assert admitted == {"contiguous": 4, "paged": budget_tokens // prompt_len}


# --- preemption by recompute ---

def test_preemption_takes_the_most_recently_admitted_and_requeues_it_first() -> None:
    sched = make(True, num_blocks=3, max_num_seqs=8)
    a, b, c = add(sched, 3, prompt_len=4, max_tokens=8)  # one full block each
    d = add(sched, 1)[0]
    step(sched)  # prefill a, b, c: the pool is full, d waits
    assert sched.running == [a, b, c] and list(sched.waiting) == [d]
    batch = step(sched)  # every one needs a second block and none is free
    assert batch.seqs == [a]
    assert sched.num_preemptions == 2
    assert list(sched.waiting) == [b, c, d]  # back at the front, in their original order, before d
    for s in (b, c):
        assert s.status == SeqStatus.WAITING and s.block_table == [] and s.num_preemptions == 1
        assert s.num_output_tokens == 1  # the token it had survives; its KV is recomputed
    assert sched.bm.num_free_blocks == 3 - len(a.block_table)


def test_a_preempted_sequence_resumes_and_finishes_with_all_its_tokens() -> None:
    sched = make(True, num_blocks=3, max_num_seqs=8)
    seqs = add(sched, 3, prompt_len=4, max_tokens=8)
    run_all(sched)
    assert sched.num_preemptions > 0
    for s in seqs:
        assert s.is_finished and s.num_output_tokens == 8
        # the fake token at each position is 1000 + position: recompute did not skip or repeat one
        assert s.output_token_ids == [1000 + 4 + i for i in range(8)]
    assert sched.bm.all_free()


def test_static_batching_preempts_too_when_paged_blocks_run_out() -> None:
    sched = make(False, num_blocks=4, batch_size=4, batch_timeout_ms=0)
    seqs = add(sched, 4, prompt_len=4, max_tokens=6)
    run_all(sched)
    assert sched.num_preemptions > 0
    assert all(s.is_finished and s.num_output_tokens == 6 for s in seqs)
    assert sched.bm.all_free()


# --- no starvation under overload, and every block back in the pool ---

def test_every_request_of_an_overloaded_queue_finishes() -> None:
    for dynamic in (True, False):
        sched = make(dynamic, num_blocks=12, max_num_seqs=8, max_num_batched_tokens=64, batch_size=8,
                     batch_timeout_ms=0)
        seqs = [s for i in range(30) for s in add(sched, 1, prompt_len=3 + i % 9, max_tokens=2 + (7 * i) % 13)]
        run_all(sched)
        assert all(s.is_finished and s.num_output_tokens == s.params.max_tokens for s in seqs), dynamic
        assert sched.bm.all_free() and not sched.running and not sched.waiting
    assert sched.num_preemptions > 0  # the paged pool really ran out


def test_requests_arriving_while_others_run_are_not_starved() -> None:
    sched = make(True, num_blocks=10, max_num_seqs=4)
    seqs = []
    for i in range(40):  # a steady stream: one arrival per step, more than the pool can hold at once
        seqs += add(sched, 1, prompt_len=6, max_tokens=10)
        step(sched)
    run_all(sched)
    assert all(s.is_finished for s in seqs)
    assert sched.bm.all_free()


# --- chunked prefill (chunked_prefill on, with dynamic_batching) ---

def chunked(num_blocks: int, budget: int, block_size: int = 4, **kw) -> Scheduler:
    return Scheduler(config(True, chunked_prefill=True, max_num_batched_tokens=budget, **kw),
                     BlockManager(num_blocks, block_size))


def test_chunked_splits_a_long_prompt_across_steps_and_samples_only_at_its_end() -> None:
    sched = chunked(num_blocks=64, budget=8, max_num_seqs=4)
    (s,) = add(sched, 1, prompt_len=20, max_tokens=2)
    sizes = []
    while not s.output_token_ids:
        batch = step(sched)
        sizes.append(batch.num_new_tokens)
        assert batch.samples == [s.num_output_tokens > 0]
    assert sizes == [[8], [8], [4]]
    assert s.num_computed_tokens == 20 and sched.prompts_split == 1
    assert step(sched).num_new_tokens == [1]  # then a decode step


def test_chunked_runs_every_decode_first_then_fills_the_budget_with_prompt_chunks() -> None:
    sched = chunked(num_blocks=64, budget=10, max_num_seqs=8)
    early = add(sched, 3, prompt_len=3, max_tokens=8)
    step(sched)  # the three prompts, whole: 9 tokens
    late = add(sched, 1, prompt_len=20, max_tokens=4)
    for expect in ([1, 1, 1, 7], [1, 1, 1, 7], [1, 1, 1, 6], [1, 1, 1, 1]):
        batch = step(sched)
        assert batch.seqs == early + late and batch.num_new_tokens == expect
        assert batch.num_tokens <= 10 and sched.decodes_waiting == 0
    assert late[0].num_output_tokens == 2


def test_without_chunks_a_prompt_step_leaves_the_running_decodes_waiting() -> None:
    sched = make(True, num_blocks=64, max_num_seqs=8)
    add(sched, 3, prompt_len=3, max_tokens=8)
    step(sched)
    add(sched, 1, prompt_len=20, max_tokens=4)
    batch = step(sched)
    assert batch.is_prefill and len(batch.seqs) == 1 and sched.decodes_waiting == 3


def test_chunked_admits_nothing_new_in_a_step_that_had_to_preempt() -> None:
    sched = chunked(num_blocks=4, budget=64, max_num_seqs=8)
    first = add(sched, 2, prompt_len=4, max_tokens=8)  # one block each, a second from their first decode
    step(sched)
    newcomer = add(sched, 1, prompt_len=4, max_tokens=8)
    batch = step(sched)
    assert batch.seqs == first and newcomer[0].status is SeqStatus.WAITING  # the pool is empty now
    while sched.num_preemptions == 0:  # until the decodes need a third block each
        batch = step(sched)
    # the second sequence was preempted to give the first its block; a block is free again, but a step
    # that had to preempt admits nothing (the newcomer would only be preempted in turn)
    assert batch.seqs == first[:1] and first[1].status is SeqStatus.WAITING
    assert newcomer[0].status is SeqStatus.WAITING and sched.bm.num_free_blocks == 1
    assert list(sched.waiting)[:2] == [first[1], newcomer[0]]  # the preempted one goes first


def test_chunked_finishes_an_overloaded_queue_with_preemption_and_exact_lengths() -> None:
    sched = chunked(num_blocks=8, budget=6, max_num_seqs=8)
    seqs = add(sched, 10, prompt_len=9, max_tokens=12)  # 9 tokens: 3 blocks; 21 at the end: 6 of the 8
    run_all(sched)
    assert sched.num_preemptions > 0 and sched.prompts_split > 0
    assert all(s.is_finished and s.num_output_tokens == 12 for s in seqs)
    assert sched.bm.all_free()


# --- boundaries: each limit is reached exactly, not one short or one over ---

def test_static_releases_exactly_batch_size_waiting_requests_without_waiting_for_the_timeout() -> None:
    sched = make(False, num_blocks=64, batch_size=4, batch_timeout_ms=10_000)
    seqs = add(sched, 4, t=1.0)
    batch = sched.schedule(now=1.0)
    assert batch is not None and batch.seqs == seqs and not sched.waiting
    assert all(s.status is SeqStatus.RUNNING for s in seqs)


def test_static_timeout_releases_a_short_batch_at_the_deadline_and_not_before() -> None:
    sched = make(False, num_blocks=64, batch_size=4, batch_timeout_ms=1000)
    (s,) = add(sched, 1, t=0.0)
    assert sched.next_deadline() == 1.0
    assert sched.schedule(now=0.9995) is None and list(sched.waiting) == [s]
    batch = sched.schedule(now=1.0)  # waited exactly batch_timeout_ms
    assert batch is not None and batch.seqs == [s]


def test_next_deadline_is_the_oldest_waiting_request_plus_the_timeout_only_while_a_batch_is_held() -> None:
    sched = make(False, num_blocks=64, batch_size=4, batch_timeout_ms=500)
    assert sched.next_deadline() is None  # nothing waiting
    add(sched, 1, t=1.0)
    add(sched, 1, t=2.0)
    assert sched.next_deadline() == 1.5  # the oldest, not the newest
    step(sched)  # the timeout has passed: both run
    add(sched, 1, t=3.0)
    assert sched.running and sched.waiting
    assert sched.next_deadline() is None  # a batch is running: nothing is being held back by a timeout
    cont = make(True, num_blocks=64)
    add(cont, 1, t=1.0)
    assert cont.next_deadline() is None  # continuous batching holds nothing back


def test_continuous_admits_prompts_that_fill_the_token_budget_exactly() -> None:
    sched = make(True, num_blocks=256, max_num_seqs=16, max_num_batched_tokens=200)
    seqs = add(sched, 3, prompt_len=100)
    batch = sched.schedule(now=0.0)
    assert batch.seqs == seqs[:2] and batch.num_tokens == 200
    assert list(sched.waiting) == seqs[2:]


def test_chunked_admits_new_prompts_up_to_max_num_seqs_and_no_more() -> None:
    sched = chunked(num_blocks=64, budget=64, max_num_seqs=2)
    seqs = add(sched, 3, prompt_len=4)
    batch = step(sched)
    assert batch.seqs == seqs[:2] and list(sched.waiting) == seqs[2:]
    assert step(sched).seqs == seqs[:2]  # both decode; the third still has no seat


def test_chunked_spends_the_last_token_of_the_budget() -> None:
    sched = chunked(num_blocks=64, budget=3, max_num_seqs=8)
    a = add(sched, 1, prompt_len=2, max_tokens=5)[0]
    b = add(sched, 1, prompt_len=1, max_tokens=5)[0]
    batch = step(sched)
    assert batch.seqs == [a, b] and batch.num_new_tokens == [2, 1]  # b takes the one token left
    c = add(sched, 1, prompt_len=1, max_tokens=5)[0]
    batch = step(sched)  # two decodes leave one token: c's whole prompt
    assert batch.seqs == [a, b, c] and batch.num_new_tokens == [1, 1, 1]
    batch = step(sched)  # three decodes use the whole budget, the last one included
    assert batch.seqs == [a, b, c] and batch.num_new_tokens == [1, 1, 1] and batch.is_decode
    assert sched.decodes_waiting == 0 and sched.prompts_split == 0


def test_chunked_cuts_only_the_last_new_prompt_and_counts_it_once_as_split() -> None:
    sched = chunked(num_blocks=64, budget=10, max_num_seqs=8)
    seqs = add(sched, 5, prompt_len=3, max_tokens=4)
    batch = step(sched)
    assert batch.seqs == seqs[:4] and batch.num_new_tokens == [3, 3, 3, 1]
    assert batch.samples == [True, True, True, False]
    assert sched.prompts_split == 1  # the three whole prompts are not split
    batch = step(sched)  # three decodes, the rest of the fourth prompt, then the fifth prompt whole
    assert batch.seqs == seqs and batch.num_new_tokens == [1, 1, 1, 2, 3]
    assert sched.prompts_split == 1  # the fourth is counted once; the fifth ran whole


def test_chunked_counts_every_split_prompt() -> None:
    sched = chunked(num_blocks=64, budget=8, max_num_seqs=8)
    a, b = add(sched, 2, prompt_len=12, max_tokens=1)
    while a.status is not SeqStatus.FINISHED or b.status is not SeqStatus.FINISHED:
        step(sched)
    assert sched.prompts_split == 2


def test_a_cached_prefix_is_not_counted_as_a_split_and_is_shared_within_the_step() -> None:
    # the first request's step writes its full blocks; the second, admitted later in the same step, reuses
    # the one cacheable block and computes only the rest of its prompt, whole
    sched = Scheduler(config(True, chunked_prefill=True, max_num_batched_tokens=16, max_num_seqs=8),
                      BlockManager(64, 4, enable_prefix_cache=True))
    prompt = list(range(100, 108))
    a = Sequence("a", prompt, SamplingParams(max_tokens=2))
    b = Sequence("b", prompt, SamplingParams(max_tokens=2))
    sched.add(a)
    sched.add(b)
    batch = sched.schedule(now=0.0)
    assert batch.seqs == [a, b] and batch.num_new_tokens == [8, 4] and batch.samples == [True, True]
    assert b.num_cached_tokens == 4 and sched.bm.prefix_hits == 1
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]
    assert sched.prompts_split == 0


def test_continuous_shares_a_prefix_written_earlier_in_the_same_step() -> None:
    sched = Scheduler(config(True, max_num_seqs=8), BlockManager(64, 4, enable_prefix_cache=True))
    prompt = list(range(200, 210))
    a, b = (Sequence(r, prompt, SamplingParams(max_tokens=2)) for r in "ab")
    sched.add(a)
    sched.add(b)
    batch = sched.schedule(now=0.0)
    assert batch.seqs == [a, b] and batch.num_new_tokens == [10, 2]
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]


# --- counters: the evidence opts_effective reads ---

def test_batch_sizes_seen_counts_every_step_by_its_size() -> None:
    sched = make(False, num_blocks=64, batch_size=2, batch_timeout_ms=0)
    assert sched.batch_sizes_seen == {} and sched.decodes_waiting == 0 and sched.num_preemptions == 0
    add(sched, 3, max_tokens=2)
    run_all(sched)  # a prefill and a decode of two, then of the third alone
    assert sched.batch_sizes_seen == {2: 2, 1: 2}
    assert sched.schedule(now=1e9) is None
    assert sched.batch_sizes_seen == {2: 2, 1: 2}  # a step with nothing to run is not a batch


def test_chunked_with_nothing_to_do_schedules_no_batch() -> None:
    sched = chunked(num_blocks=16, budget=8)
    assert sched.schedule(now=0.0) is None and sched.batch_sizes_seen == {}
    (s,) = add(sched, 1, prompt_len=4, max_tokens=1)
    step(sched)
    assert s.is_finished and sched.schedule(now=0.0) is None and sched.batch_sizes_seen == {1: 1}


def test_batch_rejects_rows_without_tokens_or_without_a_count() -> None:
    a = Sequence("a", [1, 2, 3], SamplingParams())
    b = Sequence("b", [1, 2, 3], SamplingParams())
    with pytest.raises(AssertionError):
        Batch([a], [0])
    with pytest.raises(AssertionError):
        Batch([a, b], [3])
    assert Batch([a, b], [3, 2]).samples == [True, False]


# --- finishing: length, eos, max_model_len ---

def test_eos_stops_only_requests_that_do_not_ignore_it() -> None:
    sched = Scheduler(config(True), BlockManager(64, 4), eos_token_ids=(2,))
    stops = Sequence("stops", [5, 6, 7], SamplingParams(max_tokens=10, ignore_eos=False))
    ignores = Sequence("ignores", [5, 6, 7], SamplingParams(max_tokens=10, ignore_eos=True))
    sched.add(stops)
    sched.add(ignores)
    assert sched.postprocess(sched.schedule(now=0.0), [9, 9]) == []  # not eos: both go on
    assert sched.postprocess(sched.schedule(now=0.0), [2, 2]) == [stops]
    assert stops.is_finished and stops.finish_reason == "stop" and stops.block_table == []
    assert ignores.status is SeqStatus.RUNNING and ignores.finish_reason is None
    assert sched.running == [ignores] and ignores.output_token_ids == [9, 2]


def test_a_sequence_stops_when_it_reaches_max_model_len() -> None:
    sched = Scheduler(EngineConfig(dynamic_batching=True, max_model_len=10), BlockManager(8, 4))
    (s,) = add(sched, 1, prompt_len=8, max_tokens=100)
    step(sched)
    assert not s.is_finished and len(s) == 9
    batch = sched.schedule(now=0.0)
    assert sched.postprocess(batch, [1]) == [s]
    assert len(s) == 10 and s.finish_reason == "max_model_len" and sched.bm.all_free()


def test_postprocess_skips_a_prompt_chunk_row_wherever_it_stands_in_the_batch() -> None:
    sched = chunked(num_blocks=64, budget=6, max_num_seqs=8)
    (a,) = add(sched, 1, prompt_len=2, max_tokens=8)
    step(sched)
    (p,) = add(sched, 1, prompt_len=12, max_tokens=2)
    batch = sched.schedule(now=0.0)
    assert batch.seqs == [a, p] and batch.samples == [True, False]
    # the same rows, the prompt chunk first: every row still advances, the sampled one gets its token
    flipped = Batch(batch.seqs[::-1], batch.num_new_tokens[::-1])
    assert sched.postprocess(flipped, [77]) == []
    assert p.num_computed_tokens == 5 and not p.output_token_ids
    assert a.num_computed_tokens == 3 and a.output_token_ids[-1] == 77


# --- abort ---

def test_abort_a_waiting_request() -> None:
    sched = make(True, num_blocks=64)
    first, second = add(sched, 2)
    assert sched.abort(second.request_id) is second
    assert second.is_finished and second.finish_reason == "abort"
    assert list(sched.waiting) == [first] and first.status is SeqStatus.WAITING
    assert sched.abort(second.request_id) is None and sched.abort("nobody") is None
    assert sched.bm.all_free()


def test_abort_a_running_request_frees_its_blocks_at_once() -> None:
    sched = make(True, num_blocks=16)
    first, second = add(sched, 2, prompt_len=6, max_tokens=8)
    step(sched)
    free_before = sched.bm.num_free_blocks
    assert sched.abort(second.request_id) is second
    assert second.is_finished and second.finish_reason == "abort" and second.block_table == []
    assert sched.running == [first] and first.block_table
    assert sched.bm.num_free_blocks == free_before + 2
    assert step(sched).seqs == [first]
    assert sched.abort(first.request_id) is first and sched.bm.all_free() and not sched.has_unfinished()
