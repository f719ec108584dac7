"""The KV block manager as plain bookkeeping: no model, no torch, milliseconds.

Sequences are built by hand; a prefill is simulated by allocating and then registering the blocks the
step writes (what the scheduler does when it schedules the step), a decode step by appending a token and
calling may_append and register_full_blocks likewise.
"""
from __future__ import annotations

import pytest

from optladder.engine.block_manager import BlockManager, chain_hash
from optladder.engine.sequence import SamplingParams, Sequence

BS = 4


def seq(tokens: list[int], max_tokens: int = 16) -> Sequence:
    return Sequence(f"r{tokens[:3]}", tokens, SamplingParams(max_tokens=max_tokens))


def computed(bm: BlockManager, s: Sequence, upto: int | None = None) -> None:
    """A step that writes the KV of s's tokens up to `upto` (default: all of them) is scheduled and runs."""
    upto = len(s) if upto is None else upto
    bm.register_full_blocks(s, upto)
    s.num_computed_tokens = upto


def prefill(bm: BlockManager, s: Sequence) -> None:
    bm.allocate(s)
    s.num_computed_tokens = s.num_cached_tokens
    computed(bm, s)


def grow(bm: BlockManager, s: Sequence, token: int = 7) -> None:
    """One decode step of bookkeeping: the new token joins the sequence, needs a KV slot, and the step
    writes its KV."""
    s.append_token(token)
    assert bm.can_append(s)
    bm.may_append(s)
    computed(bm, s)


def ref_counts(bm: BlockManager, s: Sequence) -> list[int]:
    return [bm.blocks[b].ref_count for b in s.block_table]


# --- allocation on demand, freeing, reuse order ---

def test_allocate_reserves_only_the_prompt_blocks() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    s = seq(list(range(10)))  # 10 tokens: blocks of 4, 4, 2
    assert bm.can_allocate(s)
    bm.allocate(s)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3
    assert bm.num_free_blocks == 7
    assert bm.reserved_tokens == 12
    assert bm.used_tokens == 10
    assert s.num_cached_tokens == 0


def test_decode_takes_a_new_block_only_when_the_last_one_is_full() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    s = seq(list(range(8)))  # two full blocks
    bm.allocate(s)
    assert bm.num_free_blocks == 8
    grow(bm, s)  # token 9 has no slot yet: a third block
    assert len(s.block_table) == 3 and bm.num_free_blocks == 7
    for _ in range(3):  # tokens 10..12 fill the third block
        grow(bm, s)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 7
    assert bm.used_tokens == len(s) == 12
    grow(bm, s)
    assert len(s.block_table) == 4 and bm.used_tokens == 13


def test_can_allocate_and_can_append_respect_the_pool() -> None:
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = seq(list(range(8)))
    bm.allocate(a)
    assert not bm.can_allocate(seq(list(range(100, 105))))  # needs 2, 1 free
    assert bm.can_allocate(seq(list(range(100, 104))))
    grow(bm, a)  # takes the last block
    assert bm.num_free_blocks == 0
    for _ in range(3):
        grow(bm, a)
    a.append_token(7)  # the fourth block is full: the next token has nowhere to go
    assert not bm.can_append(a)


def test_deallocate_returns_every_block_and_token() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    a, b = seq(list(range(9))), seq(list(range(50, 55)))
    bm.allocate(a)
    bm.allocate(b)
    grow(bm, a)
    bm.deallocate(a)
    assert a.block_table == []
    assert bm.used_tokens == len(b)
    assert bm.num_free_blocks == 6 - len(b.block_table)
    bm.deallocate(b)
    assert bm.all_free()


def test_fresh_blocks_come_before_freed_ones_and_a_freed_tail_goes_first() -> None:
    # never-used blocks first, then the oldest freed; a freed sequence's tail is released first so its
    # prefix blocks, the likelier to be shared, stay cached longest
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq(list(range(8)))
    bm.allocate(a)
    assert a.block_table == [0, 1]
    bm.deallocate(a)
    order = []
    for i in range(4):
        s = seq([1000 + i])
        bm.allocate(s)
        order += s.block_table
    assert order == [2, 3, 1, 0]


# --- used / reserved accounting ---

def test_contiguous_reserves_max_model_len_and_uses_only_what_is_written() -> None:
    max_model_len = 64
    bm = BlockManager(num_blocks=4, block_size=max_model_len)  # paged_kv off
    s = seq(list(range(10)))
    bm.allocate(s)
    assert len(s.block_table) == 1
    assert bm.reserved_tokens == 64 and bm.used_tokens == 10
    for _ in range(5):
        grow(bm, s)
    assert len(s.block_table) == 1  # never a second block
    assert bm.reserved_tokens == 64 and bm.used_tokens == 15
    bm.deallocate(s)
    assert bm.all_free()


def test_paged_utilization_beats_contiguous_for_the_same_sequences() -> None:
    lens = [10, 23, 5, 31]
    util = {}
    for name, bs in (("contiguous", 64), ("paged", BS)):
        bm = BlockManager(num_blocks=256 // bs, block_size=bs)
        for i, n in enumerate(lens):
            bm.allocate(seq(list(range(i * 100, i * 100 + n))))
        assert bm.used_tokens == sum(lens)
        util[name] = bm.used_tokens / bm.reserved_tokens
    assert util["contiguous"] == pytest.approx(69 / 256)
    assert util["paged"] == pytest.approx(69 / 76)  # 3 + 6 + 2 + 8 blocks of 4


# --- prefix caching ---

def test_shared_prefix_shares_blocks_by_reference_count() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_cache=True)
    prefix = list(range(8))
    a, b = seq(prefix + [20, 21]), seq(prefix + [30, 31])
    prefill(bm, a)
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert ref_counts(bm, a) == [2, 2, 1]
    assert b.num_cached_tokens == 8 and a.num_cached_tokens == 0
    assert (bm.prefix_hits, bm.prefix_queries) == (2, 4)
    assert bm.num_free_blocks == 16 - 4
    assert bm.used_tokens == 8 + 2 + 2  # a shared block counts once


def test_the_block_holding_the_last_prompt_token_is_never_a_hit() -> None:
    # its logits are needed to sample the first output token, so at least that token is computed
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_cache=True)
    prompt = list(range(8))  # exactly two full blocks
    a, b = seq(prompt), seq(list(prompt))
    prefill(bm, a)
    bm.allocate(b)
    assert b.block_table[0] == a.block_table[0]
    assert b.block_table[1] != a.block_table[1]
    assert b.num_cached_tokens == 4 < len(b)


def test_freeing_one_sharer_keeps_the_others_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_cache=True)
    prefix = list(range(8))
    a, b = seq(prefix + [1]), seq(prefix + [2])
    prefill(bm, a)
    bm.allocate(b)
    shared = b.block_table[:2]
    bm.deallocate(a)
    assert ref_counts(bm, b) == [1, 1, 1]
    assert not set(b.block_table) & set(bm.free_block_ids)
    assert bm.used_tokens == len(b)
    # the pool cannot hand b's blocks to anyone: fill it and check nobody got them
    others = [seq([500 + i]) for i in range(bm.num_free_blocks)]
    for o in others:
        bm.allocate(o)
    assert not set(shared) & {o.block_table[0] for o in others}
    for s in [b, *others]:
        bm.deallocate(s)
    assert bm.all_free()


def test_same_block_after_a_different_prefix_does_not_hit() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_cache=True)
    tail = [40, 41, 42, 43]
    a, b = seq([1, 2, 3, 4] + tail + [9]), seq([5, 6, 7, 8] + tail + [9])
    prefill(bm, a)
    bm.allocate(b)
    assert not set(a.block_table) & set(b.block_table)
    assert bm.prefix_hits == 0 and b.num_cached_tokens == 0
    assert chain_hash(tail, chain_hash([1, 2, 3, 4])) != chain_hash(tail, chain_hash([5, 6, 7, 8]))


def test_freed_blocks_stay_cached_until_the_pool_reuses_them() -> None:
    bm = BlockManager(num_blocks=3, block_size=BS, enable_prefix_cache=True)
    prompt = list(range(8)) + [99]
    a = seq(prompt)
    prefill(bm, a)
    cached = a.block_table[:2]
    bm.deallocate(a)
    assert bm.all_free()
    b = seq(list(prompt))  # after a finished: its blocks are still in the pool with their tokens
    bm.allocate(b)
    assert b.block_table[:2] == cached and b.num_cached_tokens == 8
    assert bm.used_tokens == 9 and ref_counts(bm, b) == [1, 1, 1]
    bm.deallocate(b)
    # three other sequences take all three blocks: the cached content is overwritten...
    others = [seq([700 + i]) for i in range(3)]
    for o in others:
        bm.allocate(o)
    for o in others:
        bm.deallocate(o)
    # ...so the same prompt must miss now, or it would read another sequence's KV
    c = seq(list(prompt))
    bm.allocate(c)
    assert c.num_cached_tokens == 0


def test_a_block_filled_during_decode_becomes_shareable() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_cache=True)
    a = seq([1, 2, 3])
    prefill(bm, a)
    grow(bm, a, token=4)  # the first block is now full of computed KV: registered under its hash
    b = seq([1, 2, 3, 4, 5])
    bm.allocate(b)
    assert b.block_table[0] == a.block_table[0] and b.num_cached_tokens == 4


def test_without_prefix_cache_nothing_is_shared() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_cache=False)
    a, b = seq(list(range(9))), seq(list(range(9)))
    bm.allocate(a)
    bm.allocate(b)
    assert not set(a.block_table) & set(b.block_table)
    assert bm.prefix_queries == 0 and b.num_cached_tokens == 0


def test_a_hash_collision_never_shares_kv(monkeypatch) -> None:
    # 64-bit hashes can collide; the block's own tokens are compared before its KV is reused
    monkeypatch.setattr("optladder.engine.block_manager.chain_hash", lambda tokens, prefix=-1: 42)
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_cache=True)
    a, b = seq([1, 2, 3, 4, 5]), seq([6, 7, 8, 9, 10])
    prefill(bm, a)
    bm.allocate(b)
    assert b.block_table[0] != a.block_table[0] and b.num_cached_tokens == 0


def test_a_block_is_shared_only_once_a_step_writes_its_kv() -> None:
    # chunked prefill computes a prompt over several steps: a later request must not reuse blocks whose
    # KV no step has written yet, and may reuse each one from the step that writes it
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_cache=True)
    prompt = list(range(12)) + [99]
    a = seq(prompt)
    bm.allocate(a)
    b = seq(list(prompt))
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not set(a.block_table) & set(b.block_table)
    computed(bm, a, upto=6)  # the first chunk: one full block written, the second half
    c = seq(list(prompt))
    bm.allocate(c)
    assert c.num_cached_tokens == 4 and c.block_table[0] == a.block_table[0]
    assert c.block_table[1] != a.block_table[1]
    computed(bm, a, upto=len(a))  # the rest: blocks 1 and 2 written
    d = seq(list(prompt))
    bm.allocate(d)
    assert d.num_cached_tokens == 12 and d.block_table[:3] == a.block_table[:3]
