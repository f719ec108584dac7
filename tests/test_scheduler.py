"""Static and continuous batching, admission under a KV budget, preemption and starvation, without a model.

A step is simulated the way the engine runs it: schedule(now) -> (no forward pass) -> postprocess with
fake token ids. Fake tokens are distinct per position so a recomputed sequence is visibly the same one.
"""
from __future__ import annotations

from engine.block_manager import BlockManager
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import SamplingParams, Sequence, SeqStatus

MAX_LEN = 64


def make(dynamic: bool, num_blocks: int, block_size: int = 4, **kw) -> Scheduler:
    cfg = SchedulerConfig(dynamic_batching=dynamic, max_model_len=MAX_LEN, **kw)
    return Scheduler(cfg, BlockManager(num_blocks, block_size))


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
        sched.postprocess(batch.seqs, [1000 + len(s) for s in batch.seqs])
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
    sched = make(False, num_blocks=64, batch_size=4, batch_timeout_s=0.05)
    add(sched, 3, t=1.0)
    assert sched.schedule(now=1.01) is None
    assert sched.next_deadline() == 1.05
    batch = sched.schedule(now=1.06)
    assert batch is not None and batch.is_prefill and len(batch.seqs) == 3


def test_static_releases_a_full_batch_at_once_and_no_larger() -> None:
    sched = make(False, num_blocks=64, batch_size=4, batch_timeout_s=10.0)
    seqs = add(sched, 6, t=1.0)
    batch = sched.schedule(now=1.0)
    assert batch is not None and batch.seqs == seqs[:4]
    assert list(sched.waiting) == seqs[4:]


def test_static_runs_a_batch_to_completion_before_admitting_more() -> None:
    sched = make(False, num_blocks=64, batch_size=2, batch_timeout_s=0.0)
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
    sched = Scheduler(SchedulerConfig(dynamic_batching=False, batch_size=8, max_model_len=MAX_LEN),
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
        sched = Scheduler(SchedulerConfig(dynamic_batching=True, max_num_seqs=64, max_model_len=MAX_LEN),
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
    sched = make(False, num_blocks=4, batch_size=4, batch_timeout_s=0.0)
    seqs = add(sched, 4, prompt_len=4, max_tokens=6)
    run_all(sched)
    assert sched.num_preemptions > 0
    assert all(s.is_finished and s.num_output_tokens == 6 for s in seqs)
    assert sched.bm.all_free()


# --- no starvation under overload, and every block back in the pool ---

def test_every_request_of_an_overloaded_queue_finishes() -> None:
    for dynamic in (True, False):
        sched = make(dynamic, num_blocks=12, max_num_seqs=8, max_num_batched_tokens=64, batch_size=8,
                     batch_timeout_s=0.0)
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
