"""The prefix cache's bookkeeping (optladder/engine/block_manager.py): hits are always a prefix (once one block of a
prompt misses, every later block is computed afresh, even where a block with the same chained hash is still
cached), only full blocks are registered (by the step that writes them), each under the hash of its tokens
chained to the block before it, and a reused block leaves the cache. Steps are simulated as in
test_block_manager.py."""
from __future__ import annotations

import pytest

from optladder.engine.block_manager import BlockManager, chain_hash
from optladder.engine.sequence import SamplingParams, Sequence
from tests.test_block_manager import grow, prefill

BS = 4


def seq(name: str, tokens: list[int]) -> Sequence:
    return Sequence(name, tokens, SamplingParams(max_tokens=8))


def test_a_later_block_never_hits_after_an_earlier_miss():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_cache=True)
    prompt = list(range(100, 109))  # blocks [100..103], [104..107], [108]: two cacheable
    a = seq("a", prompt)
    prefill(bm, a)
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
    prefill(bm, a)
    b = seq("b", prompt[:8] + [999, 998])
    bm.allocate(b)
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    assert (bm.prefix_queries, bm.prefix_hits) == (4, 2)


# --- the cache's bookkeeping, checked after every operation ---

def check_cache(bm: BlockManager) -> None:
    """Only full blocks are registered, each under the hash it holds, and nothing without prefix caching."""
    if not bm.enable_prefix_cache:
        assert bm.hash_to_block == {}
    for h, block_id in bm.hash_to_block.items():
        block = bm.blocks[block_id]
        assert block.hash == h and len(block.token_ids) == bm.block_size, (h, block_id)


def check_chain(bm: BlockManager, s: Sequence) -> None:
    """Each full block of a sequence is hashed over its tokens and the hash of the block before it."""
    prefix = -1
    for i, block_id in enumerate(s.block_table):
        tokens = s.block_tokens(i, bm.block_size)
        if len(tokens) < bm.block_size:
            break
        assert bm.blocks[block_id].hash == chain_hash(tokens, prefix), i
        prefix = bm.blocks[block_id].hash


@pytest.mark.parametrize("cache", [True, False])
def test_registration_follows_the_chain_through_allocation_and_decode(cache):
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_cache=cache)
    a = seq("a", list(range(10)))  # 2 full blocks and 2 tokens
    prefill(bm, a)
    check_cache(bm)
    for t in range(7):  # fills the third block, then starts and fills part of a fourth
        grow(bm, a, 50 + t)
        check_cache(bm)
    if cache:
        check_chain(bm, a)
        assert len(bm.hash_to_block) == 4 and a.block_table[3] in bm.hash_to_block.values()
    bm.deallocate(a)
    assert a.num_cached_tokens == 0 and a.block_table == []
    b = seq("b", list(range(10)) + [50, 51, 52, 53, 54, 55, 56, 1])
    bm.allocate(b)
    assert b.num_cached_tokens == (16 if cache else 0)
    check_cache(bm)
    check_chain(bm, b) if cache else None


def test_a_reused_block_leaves_the_cache():
    bm = BlockManager(num_blocks=2, block_size=BS, enable_prefix_cache=True)
    a = seq("a", list(range(5)))
    prefill(bm, a)
    bm.deallocate(a)  # both blocks free, the full one still cached
    assert len(bm.hash_to_block) == 1
    others = [seq("x", [900, 901]), seq("y", [902])]
    for o in others:
        bm.allocate(o)
    check_cache(bm)
    assert bm.hash_to_block == {}


def test_the_last_prompt_block_never_hits_whatever_the_pool_holds():
    """A full last block is looked up nowhere, even when the pool's block at the end holds the same tokens."""
    bm = BlockManager(num_blocks=3, block_size=BS, enable_prefix_cache=True)
    prompt = list(range(8))
    a = seq("a", prompt)
    prefill(bm, a)
    grow(bm, a, 99)
    assert a.block_table == [0, 1, 2]
    bm.deallocate(a)
    b = seq("b", list(prompt))
    bm.allocate(b)
    assert b.num_cached_tokens == 4 and b.block_table[0] == 0 and b.block_table[1] != 1


def test_a_block_that_is_not_cached_never_hits_on_equal_tokens_elsewhere():
    """The tokens of the pool's last block equal this prompt's first block, under another prefix: a miss."""
    bm = BlockManager(num_blocks=2, block_size=BS, enable_prefix_cache=True)
    x, y = [1, 2, 3, 4], [5, 6, 7, 8]
    a = seq("a", x + y)
    prefill(bm, a)
    assert bm.blocks[1].token_ids == tuple(y)
    bm.deallocate(a)
    b = seq("b", y + [9])
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and bm.prefix_hits == 0


def test_blocks_allocated_counts_fresh_blocks_only():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_cache=True)
    assert bm.blocks_allocated_total == 0
    a = seq("a", list(range(9)))
    prefill(bm, a)
    assert bm.blocks_allocated_total == 3
    b = seq("b", list(range(9)))  # two blocks from the cache, one fresh
    bm.allocate(b)
    assert bm.blocks_allocated_total == 4


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0)])
def test_an_empty_pool_or_block_is_a_bug(num_blocks, block_size):
    with pytest.raises(AssertionError):
        BlockManager(num_blocks=num_blocks, block_size=block_size)
    BlockManager(num_blocks=1, block_size=1)
