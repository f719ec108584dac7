"""KV-cache bookkeeping: which block of the pool holds which tokens of which sequence. No torch.

One mechanism serves both settings of `paged_kv`, read once where the engine picks `block_size`:
- off (contiguous): block_size = max_model_len, so an admitted sequence takes one block that reserves
  max_model_len slots up front and never needs another;
- on (paged): small blocks allocated on demand as the sequence grows and freed at finish.
Prefix caching (paged only) reuses full blocks whose chained hash and tokens match, by reference count.
A block is registered for reuse by the step that writes its KV (`register_full_blocks`, when the step is
scheduled): a request admitted later in the same step may already share it, since every layer stores the
step's K/V before it attends; a block that a later chunk of a split prompt will write is not registered
yet, so chunked prefill never lends out KV that no step has written.
A sequence's `block_table` list is only ever appended to; whatever else changes it replaces the list
(deallocate, rollback): the model runner keeps a numpy copy that takes only the appended entries.
"""
from __future__ import annotations

import hashlib
import struct
from collections import deque
from dataclasses import dataclass

from optladder.engine.sequence import Sequence


@dataclass(frozen=True)
class KVLayout:
    """How the KV pool is cut, resolved once where the engine reads paged_kv: contiguous KV is one block
    of max_model_len slots per sequence, paged KV blocks of block_size."""

    block_size: int
    num_blocks: int
    fp8: bool = False  # kv_fp8: E4M3 values with a scale per token and head (optladder/engine/kv_quant.py)


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids", "num_tokens")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: tuple[int, ...] = ()
        self.num_tokens = 0  # filled slots, for KV utilization


def chain_hash(token_ids: list[int], prefix: int = -1) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<q", prefix))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return int.from_bytes(h.digest(), "little", signed=True)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = False):
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.enable_prefix_cache = enable_prefix_cache
        self.used_tokens = 0
        # evidence for opts_effective and the prefix-cache metrics
        self.blocks_allocated_total = 0
        self.prefix_queries = 0  # full prompt blocks looked up
        self.prefix_hits = 0

    # --- pool state ---
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def reserved_tokens(self) -> int:
        return (self.num_blocks - self.num_free_blocks) * self.block_size

    def all_free(self) -> bool:
        return self.num_free_blocks == self.num_blocks and self.used_tokens == 0

    def _take(self, block_id: int) -> Block:
        block = self.blocks[block_id]
        assert block.ref_count == 0
        self.free_block_ids.remove(block_id)
        block.ref_count = 1
        return block

    def _take_fresh(self) -> Block:
        block = self._take(self.free_block_ids[0])
        if block.hash != -1 and self.hash_to_block.get(block.hash) == block.block_id:
            del self.hash_to_block[block.hash]
        block.hash, block.token_ids, block.num_tokens = -1, (), 0
        self.blocks_allocated_total += 1
        return block

    def _release(self, block: Block, front: bool = False) -> None:
        block.ref_count -= 1
        assert block.ref_count >= 0
        if block.ref_count == 0:
            self.used_tokens -= block.num_tokens
            if front:  # nothing to keep: taken again before any block that holds a reusable prefix
                self.free_block_ids.appendleft(block.block_id)
            else:
                self.free_block_ids.append(block.block_id)  # keeps hash and tokens for later reuse

    # --- admission ---
    def _cacheable_blocks(self, seq: Sequence) -> int:
        """Full blocks that may come from the cache: at least one token must be computed, for its logits."""
        return (len(seq) - 1) // self.block_size if self.enable_prefix_cache else 0

    def can_allocate(self, seq: Sequence) -> bool:
        return self.num_free_blocks >= seq.num_blocks(self.block_size)

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table
        bs, prefix, cache_miss = self.block_size, -1, False
        n_cacheable = self._cacheable_blocks(seq)
        for i in range(seq.num_blocks(bs)):
            tokens = seq.block_tokens(i, bs)
            full = len(tokens) == bs
            h = chain_hash(tokens, prefix) if full and self.enable_prefix_cache else -1
            block_id = self.hash_to_block.get(h, -1) if i < n_cacheable else -1
            if i < n_cacheable:
                self.prefix_queries += 1
            if block_id == -1 or self.blocks[block_id].token_ids != tuple(tokens):
                cache_miss = True
            if cache_miss:
                block = self._take_fresh()
                block.num_tokens = len(tokens)
                self.used_tokens += len(tokens)
            else:
                self.prefix_hits += 1
                seq.num_cached_tokens += bs
                block = self.blocks[block_id]
                if block.ref_count > 0:
                    block.ref_count += 1
                else:
                    self._take(block_id)
                    self.used_tokens += block.num_tokens
            prefix = h
            seq.block_table.append(block.block_id)

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            self._release(self.blocks[block_id])
        seq.block_table, seq.block_table_np = [], None
        seq.num_cached_tokens = 0

    # --- growth during decode: the step writes the KV of the last token, at position len(seq) - 1, and with
    # speculative decoding that of num_tokens - 1 draft tokens after it ---
    def can_append(self, seq: Sequence, num_tokens: int = 1) -> bool:
        needs = -(-(len(seq) - 1 + num_tokens) // self.block_size) - len(seq.block_table)
        return needs <= self.num_free_blocks

    def may_append(self, seq: Sequence, num_tokens: int = 1) -> None:
        end = len(seq) - 1 + num_tokens  # positions [len(seq) - 1, end) are written
        while len(seq.block_table) * self.block_size < end:
            seq.block_table.append(self._take_fresh().block_id)
        self._fill(seq, len(seq) - 1, end)

    def _fill(self, seq: Sequence, start: int, end: int) -> None:
        """Slots up to `end` hold KV in the blocks that cover positions [start, end)."""
        bs = self.block_size
        for i in range(start // bs, -(-end // bs)):
            block = self.blocks[seq.block_table[i]]
            filled = min(bs, end - i * bs)
            self.used_tokens += filled - block.num_tokens
            block.num_tokens = filled

    def rollback(self, seq: Sequence) -> None:
        """Speculative decoding: after verification only seq.num_computed_tokens positions hold KV that is
        kept; the blocks beyond them (taken for drafts that were rejected, or never proposed) go back to the
        pool, first in line, since they hold nothing worth keeping for prefix reuse, and the last block's fill
        drops to the accepted tokens. The table is then exactly what one-token steps would have built."""
        bs, n = self.block_size, seq.num_computed_tokens
        keep = -(-n // bs)
        dropped = seq.block_table[keep:]
        if dropped:  # a new list, not pops: a table list is only ever appended to (the runner copies new entries)
            seq.block_table, seq.block_table_np = seq.block_table[:keep], None
        for block_id in reversed(dropped):
            block = self.blocks[block_id]
            assert block.hash == -1 and block.ref_count == 1, "a draft slot is never in a shared or cached block"
            self._release(block, front=True)
        if keep:
            last = self.blocks[seq.block_table[-1]]
            filled = n - (keep - 1) * bs
            self.used_tokens += filled - last.num_tokens
            last.num_tokens = filled

    # --- the step being scheduled writes KV: the blocks it fills become reusable by prefix ---
    def register_full_blocks(self, seq: Sequence, upto: int) -> None:
        """The step being scheduled writes seq's KV from seq.num_computed_tokens up to `upto`: register
        every block that it fills, chaining each hash on the block before it."""
        if not self.enable_prefix_cache:
            return
        bs = self.block_size
        for i in range(seq.num_computed_tokens // bs, upto // bs):
            block = self.blocks[seq.block_table[i]]
            if block.hash != -1:  # it came from the cache
                continue
            prefix = self.blocks[seq.block_table[i - 1]].hash if i > 0 else -1
            tokens = seq.block_tokens(i, bs)
            block.hash, block.token_ids = chain_hash(tokens, prefix), tuple(tokens)
            self.hash_to_block[block.hash] = block.block_id
