"""Which sequences run in the next step, and how many of their tokens. Plain bookkeeping: no torch, no
clock of its own (`now` is passed in).

`dynamic_batching` and `chunked_prefill` are read here and only here, once, into the scheduling mode:
- static (both off): wait until `batch_size` requests are waiting or the oldest has waited
  `batch_timeout_s`, admit that batch, and run it to completion before admitting anything else;
- continuous (dynamic_batching): at every step admit waiting requests FCFS within `max_num_seqs` and
  `max_num_batched_tokens`, and retire finished ones at once; a step is either new prompts, whole, or
  one decode token for every running sequence;
- chunked (chunked_prefill, which needs dynamic_batching): every step fills one budget of
  `max_num_batched_tokens` tokens: a token for every running decode first, then the rest of any prompt
  already under way, then new prompts, the last one cut to what is left of the budget (its next chunk
  comes in the next step). Running decodes never wait behind a long prompt.
In all three, a sequence that cannot get a KV block preempts the most recently admitted running sequence,
whose KV is dropped and recomputed later (it goes back to the front of the queue: nothing starves).

Speculative decoding (the engine hands its SpeculativeConfig in, or None): a decoding sequence also gets
KV slots for up to num_draft_tokens drafts after its newest token (`Batch.lookahead`), last: from the free
blocks and the token budget that the step's decodes and prompts left (drafts never preempt anyone nor keep
a prompt out, so under load they get nothing); the engine fills them with drafts and verifies them in the
step. postprocess appends the accepted tokens and gives the slots of the rest back.
"""
from __future__ import annotations

from collections import deque

from optladder.engine.batch import Batch
from optladder.engine.block_manager import BlockManager
from optladder.engine.config import EngineConfig, SpeculativeConfig
from optladder.engine.sequence import Sequence, SeqStatus


class Scheduler:
    def __init__(self, cfg: EngineConfig, block_manager: BlockManager, eos_token_ids: tuple[int, ...] = (),
                 speculative: SpeculativeConfig | None = None):
        self.cfg = cfg
        self.bm = block_manager
        self.eos_token_ids = eos_token_ids
        self.speculative = speculative
        self._num_draft_tokens = 0  # drafts a sequence may get this step (0 while speculation is off)
        self.mode = "chunked" if cfg.chunked_prefill else "continuous" if cfg.dynamic_batching else "static"
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # evidence for opts_effective
        self.num_preemptions = 0
        self.batch_sizes_seen: dict[int, int] = {}
        self.prompts_split = 0  # prompts that took more than one step (chunked)
        self.decodes_waiting = 0  # after the last schedule(): running decodes left out of the step

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> Batch | None:
        spec = self.speculative
        busy = spec is not None and spec.disable_by_batch_size is not None and \
            len(self.running) > spec.disable_by_batch_size
        self._num_draft_tokens = spec.num_draft_tokens if spec is not None and not busy else 0
        if self.mode == "chunked":
            batch = self._schedule_chunked()
        elif self.mode == "continuous":
            batch = self._schedule_continuous()
        else:
            batch = self._schedule_static(now)
        if batch is not None:
            n = len(batch.seqs)
            self.batch_sizes_seen[n] = self.batch_sizes_seen.get(n, 0) + 1
            in_step = {s.seq_id for s in batch.seqs}
            self.decodes_waiting = sum(s.seq_id not in in_step and _decoding(s) for s in self.running)
        return batch

    def next_deadline(self) -> float | None:
        """When a static batch would be released by its timeout, if one is being held back."""
        if self.mode != "static" or self.running or not self.waiting:
            return None
        return self.waiting[0].arrival_time + self.cfg.batch_timeout_ms / 1000

    # --- static batching: the baseline ---
    def _schedule_static(self, now: float) -> Batch | None:
        if self.running:
            return self._decode()
        if not self.waiting:
            return None
        oldest_wait = now - self.waiting[0].arrival_time
        if len(self.waiting) < self.cfg.batch_size and oldest_wait < self.cfg.batch_timeout_ms / 1000:
            return None
        batch: list[Sequence] = []
        counts: list[int] = []
        while self.waiting and len(batch) < self.cfg.batch_size and self.bm.can_allocate(self.waiting[0]):
            batch.append(self._admit(self.waiting.popleft()))
            counts.append(self._step_tokens(batch[-1], len(batch[-1])))
        assert batch, "an empty pool must fit one max-length sequence (checked at validation)"
        return Batch(batch, counts)

    # --- continuous batching ---
    def _schedule_continuous(self) -> Batch | None:
        batch: list[Sequence] = []
        counts: list[int] = []
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:  # _admit adds to running
            seq = self.waiting[0]
            # the first sequence of a step is admitted whatever its length, so a long prompt never starves
            over_budget = batch and sum(counts) + len(seq) > self.cfg.max_num_batched_tokens
            if over_budget or not self.bm.can_allocate(seq):
                break
            batch.append(self._admit(self.waiting.popleft()))
            counts.append(self._step_tokens(seq, len(seq)))
        if batch:
            return Batch(batch, counts)
        return self._decode() if self.running else None

    def _decode(self) -> Batch | None:
        queue = deque(self.running)
        scheduled: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            if self._reserve_decode_slot(seq, queue):
                scheduled.append(seq)
        if not scheduled:
            return None
        counts = [self._step_tokens(s, len(s)) for s in scheduled]
        return Batch(scheduled, counts, self._reserve_drafts(scheduled, self.cfg.max_num_batched_tokens - len(counts)))

    # --- chunked prefill ---
    def _schedule_chunked(self) -> Batch | None:
        budget = self.cfg.max_num_batched_tokens
        seqs: list[Sequence] = []
        counts: list[int] = []
        # running sequences first, oldest first: decodes, and prompts whose earlier chunks have run
        queue = deque(sorted(self.running, key=lambda s: not _decoding(s)))  # stable: decodes lead
        preemptions = self.num_preemptions
        while queue and budget > 0 and _decoding(queue[0]):
            seq = queue.popleft()
            if self._reserve_decode_slot(seq, queue):
                seqs.append(seq)
                counts.append(self._step_tokens(seq, len(seq)))
                budget -= 1
        num_decodes = len(seqs)
        while queue and budget > 0:  # prompts under way: their blocks were allocated whole at admission
            seq = queue.popleft()
            seqs.append(seq)
            counts.append(self._step_tokens(seq, min(len(seq), seq.num_computed_tokens + budget)))
            budget -= counts[-1]
        # then new prompts, unless KV ran short this step (they would only be preempted again)
        preempted = self.num_preemptions > preemptions
        while not preempted and budget > 0 and self.waiting and len(self.running) < self.cfg.max_num_seqs:
            if not self.bm.can_allocate(self.waiting[0]):
                break
            seq = self._admit(self.waiting.popleft())
            n = self._step_tokens(seq, min(len(seq), seq.num_computed_tokens + budget))
            self.prompts_split += n < len(seq) - seq.num_computed_tokens
            seqs.append(seq)
            counts.append(n)
            budget -= n
        # drafts last: what the prompts left of the budget and of the free blocks (under load, nothing)
        lookahead = self._reserve_drafts(seqs[:num_decodes], budget)
        return Batch(seqs, counts, lookahead + [0] * (len(seqs) - num_decodes)) if seqs else None

    # --- shared pieces ---
    def _admit(self, seq: Sequence) -> Sequence:
        self.bm.allocate(seq)
        seq.num_computed_tokens = seq.num_cached_tokens
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        return seq

    def _step_tokens(self, seq: Sequence, upto: int) -> int:
        """seq joins the step being scheduled, which writes its KV up to position `upto`: the blocks that
        fills become reusable by prefix at once. Returns the number of tokens it computes."""
        self.bm.register_full_blocks(seq, upto)
        return upto - seq.num_computed_tokens

    def _reserve_decode_slot(self, seq: Sequence, queue: deque[Sequence]) -> bool:
        """A KV slot for seq's next token, preempting from the back of `queue` (the most recently admitted
        sequences not yet in this step), or seq itself when nothing is left to take. True if it got one."""
        while not self.bm.can_append(seq):
            if queue:
                self._preempt(queue.pop())
            else:
                self._preempt(seq)
                return False
        self.bm.may_append(seq)
        return True

    def _reserve_drafts(self, seqs: list[Sequence], budget: int) -> list[int]:
        """Speculative decoding: KV slots for drafts after each decoding sequence's newest token, once every
        decode has its own slot, so drafts take only what is free (they never preempt anyone, nor leave a
        decode without a slot) and stay within `budget` tokens. A verify step yields at most drafts + 1
        tokens, so never more drafts than the request still wants (which also keeps every draft's position
        inside max_model_len). Returns the draft slots of each sequence."""
        out = []
        for seq in seqs:
            drafts = max(0, min(self._num_draft_tokens, seq.params.max_tokens - seq.num_output_tokens - 1, budget))
            while drafts and not self.bm.can_append(seq, 1 + drafts):  # what the free blocks still hold
                drafts -= 1
            if drafts:
                self.bm.may_append(seq, 1 + drafts)
            budget -= drafts
            out.append(drafts)
        return out

    def _preempt(self, seq: Sequence) -> None:
        self.bm.deallocate(seq)
        seq.reset_for_recompute()
        self.running.remove(seq)
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
    def postprocess(self, batch: Batch, token_ids: list[int] | list[list[int]]) -> list[Sequence]:
        """Advance each sequence by the tokens the step computed; append the new tokens of each sampled one
        (token_ids, in the order of batch.sampled_seqs: one token each, or with speculative decoding the
        list it accepted: its verified drafts and one more); retire and free the finished ones. Returns those."""
        finished = []
        sampled = iter(token_ids)
        for seq, n, lookahead, sample in zip(batch.seqs, batch.num_new_tokens, batch.lookahead, batch.samples):
            seq.num_computed_tokens += n
            if not sample:  # a prompt chunk: the next one comes in a later step
                continue
            out = next(sampled)
            appended = self._append(seq, out if isinstance(out, list) else [out])
            if seq.finish_reason is not None:
                seq.status = SeqStatus.FINISHED
                self.bm.deallocate(seq)
                self.running.remove(seq)
                finished.append(seq)
            elif lookahead:
                # the accepted drafts' KV was written by this step: their full blocks become reusable now,
                # and the slots of the rest are given back
                self.bm.register_full_blocks(seq, seq.num_computed_tokens + appended - 1)
                seq.num_computed_tokens += appended - 1
                self.bm.rollback(seq)
        return finished

    def _append(self, seq: Sequence, tokens: list[int]) -> int:
        """Append tokens until the request is done (its finish_reason set); returns how many went in."""
        p = seq.params
        for i, tok in enumerate(tokens):
            seq.append_token(tok)
            if seq.num_output_tokens >= p.max_tokens:
                seq.finish_reason = "length"
            elif not p.ignore_eos and tok in self.eos_token_ids:
                seq.finish_reason = "stop"
            elif len(seq) >= self.cfg.max_model_len:
                seq.finish_reason = "max_model_len"
            else:
                continue
            return i + 1
        return len(tokens)


def _decoding(seq: Sequence) -> bool:
    """Every token but the newest has its KV: the next step is a decode step for it."""
    return seq.num_computed_tokens == len(seq) - 1

