"""Prefix-cache hits are always a prefix: once one block of a prompt misses, every later block is computed
afresh, even where a block with the same chained hash is still cached (its KV continues a prefix this
sequence does not have in its own table)."""
from __future__ import annotations

from engine.block_manager import BlockManager
from engine.sequence import SamplingParams, Sequence

BS = 4


def seq(name: str, tokens: list[int]) -> Sequence:
    return Sequence(name, tokens, SamplingParams(max_tokens=8))


def test_a_later_block_never_hits_after_an_earlier_miss():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_cache=True)
    prompt = list(range(100, 109))  # blocks [100..103], [104..107], [108]: two cacheable
    a = seq("a", prompt)
    bm.allocate(a)
    head, tail = a.block_table[0], a.block_table[1]
    bm.deallocate(a)
    # the head block is reused for other tokens first (as the pool's order may have it); the tail stays cached
    bm.free_block_ids.remove(head)
    bm.free_block_ids.appendleft(head)
    other = seq("other", list(range(500, 503)))
    bm.allocate(other)
    assert other.block_table == [head]
    hits_before = bm.prefix_hits
    b = seq("b", prompt)
    bm.allocate(b)
    assert bm.prefix_hits == hits_before and b.num_cached_tokens == 0
    assert tail not in b.block_table[:1]  # the second block is computed into a fresh block, not reused
    assert b.block_table[1] != tail


def test_hits_count_whole_blocks_from_the_start():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_cache=True)
    prompt = list(range(100, 110))
    a = seq("a", prompt)
    bm.allocate(a)
    b = seq("b", prompt[:8] + [999, 998])
    bm.allocate(b)
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    assert (bm.prefix_queries, bm.prefix_hits) == (4, 2)
