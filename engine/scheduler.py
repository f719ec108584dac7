"""Which sequences run in the next step. Plain bookkeeping: no torch, no clock of its own (`now` is passed in).

`dynamic_batching` is read here and only here:
- off (static batching): wait until `batch_size` requests are waiting or the oldest has waited
  `batch_timeout_s`, admit that batch, and run it to completion before admitting anything else;
- on (continuous batching): at every step admit waiting requests FCFS within `max_num_seqs` and
  `max_num_batched_tokens`, and retire finished ones at once.
In both, a sequence that cannot get a KV block preempts the most recently admitted running sequence,
whose KV is dropped and recomputed later (it goes back to the front of the queue: nothing starves).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.block_manager import BlockManager
from engine.sequence import Sequence, SeqStatus


@dataclass
class SchedulerConfig:
    dynamic_batching: bool = False
    batch_size: int = 8
    batch_timeout_s: float = 0.05
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    eos_token_ids: tuple[int, ...] = ()
    max_model_len: int = 2048


@dataclass
class Batch:
    seqs: list[Sequence]
    is_prefill: bool


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, block_manager: BlockManager):
        self.cfg = cfg
        self.bm = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.batch_sizes_seen: dict[int, int] = {}  # evidence for opts_effective

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> Batch | None:
        batch = self._schedule_dynamic() if self.cfg.dynamic_batching else self._schedule_static(now)
        if batch is not None:
            n = len(batch.seqs)
            self.batch_sizes_seen[n] = self.batch_sizes_seen.get(n, 0) + 1
        return batch

    def next_deadline(self) -> float | None:
        """When a static batch would be released by its timeout, if one is being held back."""
        if self.cfg.dynamic_batching or self.running or not self.waiting:
            return None
        return self.waiting[0].arrival_time + self.cfg.batch_timeout_s

    # --- static batching: the baseline ---
    def _schedule_static(self, now: float) -> Batch | None:
        if self.running:
            return self._decode()
        if not self.waiting:
            return None
        oldest_wait = now - self.waiting[0].arrival_time
        if len(self.waiting) < self.cfg.batch_size and oldest_wait < self.cfg.batch_timeout_s:
            return None
        batch: list[Sequence] = []
        while self.waiting and len(batch) < self.cfg.batch_size and self.bm.can_allocate(self.waiting[0]):
            batch.append(self._admit(self.waiting.popleft()))
        assert batch, "an empty pool must fit one max-length sequence (checked at validation)"
        return Batch(batch, is_prefill=True)

    # --- continuous batching ---
    def _schedule_dynamic(self) -> Batch | None:
        batch: list[Sequence] = []
        num_tokens = 0
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:  # _admit adds to running
            seq = self.waiting[0]
            # the first sequence of a step is admitted whatever its length, so a long prompt never starves
            over_budget = batch and num_tokens + len(seq) > self.cfg.max_num_batched_tokens
            if over_budget or not self.bm.can_allocate(seq):
                break
            batch.append(self._admit(self.waiting.popleft()))
            num_tokens += len(seq) - seq.num_cached_tokens
        if batch:
            return Batch(batch, is_prefill=True)
        return self._decode() if self.running else None

    def _admit(self, seq: Sequence) -> Sequence:
        self.bm.allocate(seq)
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        return seq

    def _decode(self) -> Batch | None:
        queue = deque(self.running)
        scheduled: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            while not self.bm.can_append(seq):
                if queue:
                    self._preempt(queue.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                self.bm.may_append(seq)
                scheduled.append(seq)
        self.running = list(scheduled)  # a copy: postprocess retires from running, not from the batch
        return Batch(scheduled, is_prefill=False) if scheduled else None

    def _preempt(self, seq: Sequence) -> None:
        self.bm.deallocate(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def abort(self, request_id: str) -> Sequence | None:
        """Drop a request wherever it stands (a client went away), freeing its KV blocks at once.
        Returns the sequence, finished with reason "abort", or None if no unfinished request has that id."""
        seq = next((s for s in self.waiting if s.request_id == request_id), None)
        if seq is not None:
            self.waiting.remove(seq)
        else:
            seq = next((s for s in self.running if s.request_id == request_id), None)
            if seq is None:
                return None
            self.running.remove(seq)
        if seq.block_table:  # a running sequence, or a waiting one that holds blocks
            self.bm.deallocate(seq)
        seq.status, seq.finish_reason = SeqStatus.FINISHED, "abort"
        return seq

    # --- after the step ---
    def postprocess(self, seqs: list[Sequence], token_ids: list[int]) -> list[Sequence]:
        """Append each sequence's new token; retire and free the finished ones. Returns those."""
        finished = []
        for seq, tok in zip(seqs, token_ids):
            seq.append_token(tok)
            seq.num_computed_tokens = len(seq) - 1
            p = seq.params
            if seq.num_output_tokens >= p.max_tokens:
                seq.finish_reason = "length"
            elif not p.ignore_eos and tok in self.cfg.eos_token_ids:
                seq.finish_reason = "stop"
            elif len(seq) >= self.cfg.max_model_len:
                seq.finish_reason = "max_model_len"
            else:
                continue
            seq.status = SeqStatus.FINISHED
            self.bm.deallocate(seq)
            self.running.remove(seq)
            finished.append(seq)
        return finished
