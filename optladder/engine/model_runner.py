"""The only part of the engine that touches the device each step: KV cache tensors, input preparation,
the forward pass and sampling.

A step is a `Batch` (optladder/engine/scheduler.py): each sequence computes its next `num_new_tokens` tokens.
- all of them one decode token: the decode path (graph replay when the engine built a CUDAGraphRunner,
  the fused decode kernels when `DecodeKernels` says so, else the eager layer);
- anything else (whole prompts, prompt chunks, or chunks mixed with decode rows): the varlen path, each
  sequence's queries the last positions of its context, attention over the paged cache.
Logits come back only for the sequences that get a token this step (a prompt chunk gets none).

Speculative decoding: a decode row with k drafts computes k + 1 tokens and returns k + 1 logits rows (the
target's next-token distribution after its newest token and after each draft). In a step of decode rows
only, each of those tokens is a query row of its own whose context ends at its position (every layer stores
the step's K/V before it attends, so a draft sees the ones before it): a verify step is a decode step of
more rows, and replays the decode graphs like one. In a step with prompt tokens, the row's k + 1 queries go
through the varlen path. The draft of `draft_layers` runs decode rows through the first layers only
(`draft_logits`), eagerly.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch

from optladder.engine.attention import AttnMeta, packed
from optladder.engine.block_manager import KVLayout
from optladder.engine.kv_quant import QuantKV
from optladder.engine.model import DecodeKernels, LlamaModel, LlamaShape
from optladder.engine.scheduler import Batch
from optladder.engine.sequence import SamplingParams, Sequence


def kv_bytes_per_token(model: LlamaModel | LlamaShape, dtype: torch.dtype) -> int:
    shape = model.shape if isinstance(model, LlamaModel) else model
    return shape.kv_bytes_per_token(torch.finfo(dtype).bits // 8)


class ModelRunner:
    def __init__(self, model: LlamaModel, device: torch.device, dtype: torch.dtype, layout: KVLayout, attn,
                 kernels: DecodeKernels = DecodeKernels(), graph_max_batch: int | None = None,
                 max_model_len: int = 2048, piecewise_max_tokens: int | None = None, plant: str | None = None):
        """graph_max_batch: capture decode steps in CUDA graphs up to this batch (None: no graphs);
        piecewise_max_tokens: and steps with prompt tokens piecewise, up to this many tokens (optladder/engine/piecewise.py;
        None: eagerly). plant: a bug planted on purpose (engine.debug_plant, optladder/engine/config.py PLANTS)."""
        self.model, self.device, self.dtype = model, device, dtype
        self.plant, self.num_blocks = plant, layout.num_blocks
        self.block_size = layout.block_size
        # the widest block table a sequence can have: max_model_len's blocks (drafts' slots stay within it), + slack
        self.table_capacity = -(-max_model_len // layout.block_size) + 8
        self.kernels = kernels
        s = model.shape
        # under graphs one block more than the block manager knows: the padding rows' dummy slot
        pool_blocks = layout.num_blocks + (graph_max_batch is not None)
        for layer in model.layers:
            # zeros, not empty: masked-out slots are multiplied by 0 in attention, and 0 * NaN is NaN
            if layout.fp8:  # kv_fp8, as the engine decided: E4M3 values with scales (optladder/engine/kv_quant.py)
                layer.k_cache, layer.v_cache = (QuantKV.zeros(pool_blocks, layout.block_size, s.num_key_value_heads,
                                                              s.head_dim, dtype, device) for _ in range(2))
                continue
            layer.k_cache = torch.zeros(pool_blocks, layout.block_size, s.num_key_value_heads, s.head_dim,
                                        dtype=dtype, device=device)
            layer.v_cache = torch.zeros_like(layer.k_cache)
        model.attn = attn
        self.generators: dict[int, torch.Generator] = {}
        self.timers = None  # the engine's StageTimers: a forward's input preparation is timed as "prepare"
        self.eager_decode_steps = 0  # decode steps run outside graphs (through the fused kernels if on)
        self.graphs = None
        if graph_max_batch is not None:
            from optladder.engine.cuda_graphs import CUDAGraphRunner

            self.graphs = CUDAGraphRunner(model, device, graph_max_batch, max_model_len, layout.block_size,
                                          dummy_block=layout.num_blocks, kernels=kernels)
        self.piecewise = None
        if piecewise_max_tokens is not None:
            assert graph_max_batch is not None, "piecewise_graphs needs cuda_graphs (checked at validation)"
            from optladder.engine.piecewise import PiecewiseGraphRunner

            self.piecewise = PiecewiseGraphRunner(model, device, piecewise_max_tokens,
                                                  dummy_slot=layout.num_blocks * layout.block_size, kernels=kernels)

    @property
    def attention_backend(self) -> str:
        """The prefill backend, then the decode one; graph-replayed decode names its own kernel."""
        attn = self.model.attn
        name = attn.name if not hasattr(attn, "decode_backend") else f"{attn.name}+{attn.decode_backend}"
        return name if self.graphs is None else f"{name} (graph decode: {self.graphs.attn.name})"

    # --- inputs ---
    def _table_rows(self, seqs: list[Sequence]) -> torch.Tensor:
        """The sequences' block tables, padded with block 0 to the widest, on the host. Each sequence keeps a
        numpy copy of its table (`Sequence.block_table_np`) that takes only the entries appended since the
        step before, instead of converting the whole list every step (for 250 sequences of ~100 blocks that
        conversion took 3-4 ms of host time a step on the 2-core CPU: benchmarks/cpu_host_prep.py). It relies on
        BlockManager's rule that a block table list is only ever appended to, anything else replacing the list."""
        width = max(len(s.block_table) for s in seqs)
        if width > self.table_capacity:  # longer than any table should be: the plain conversion, still right
            return table_rows_from_lists(seqs)
        if len(seqs) == 1:  # batch 1: no stack (a copy: the tensor never aliases the kept array)
            return torch.from_numpy(self._table_np(seqs[0])[None, :width].copy())
        return torch.from_numpy(np.stack([self._table_np(s)[:width] for s in seqs]))

    def _table_np(self, seq: Sequence) -> np.ndarray:
        """seq's block table as numpy int32 of table_capacity entries, zero past its end, kept in step with the list."""
        table, cached, n = seq.block_table, seq.block_table_np, len(seq.block_table)
        done = 0
        if cached is not None and cached[0] is table and cached[1] <= n and len(cached[2]) == self.table_capacity:
            _, done, buf = cached
            # the last entry copied still matches: a pop and an append of another block in place (which
            # BlockManager never does) would be caught here, not served stale
            if done and buf[done - 1] != table[done - 1]:
                done = 0
            elif done == n:
                return buf
        if not done:  # a new list (the first step, a preemption, a rollback) or one changed in place: from scratch
            buf = np.zeros(self.table_capacity, dtype=np.int32)
        buf[done:n] = table[done:]
        seq.block_table_np = (table, n, buf)
        return buf

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        rows = self._table_rows(seqs)
        if self.plant == "kv_block_off_by_one" and len(seqs) > 1:  # planted: the second row reads its next block
            rows = rows.clone()
            n = len(seqs[1].block_table)
            rows[1, :n] = (rows[1, :n] + 1) % self.num_blocks
        return rows.to(self.device)

    def _slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """The cache slots of seq's positions [start, end): numpy for a long run, plain Python for a few
        (a decode row of a mixed step; a numpy array per row would cost more than its arithmetic)."""
        bs, table = self.block_size, seq.block_table
        if end - start <= 16:
            return [table[p // bs] * bs + p % bs for p in range(start, end)]
        pos = np.arange(start, end)
        return (np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs).tolist()

    def prepare_varlen(self, batch: Batch):
        """Token ids, positions, attention metadata and the rows whose logits are needed, for a step of
        variable-length queries (each sequence's next num_new_tokens tokens, and its drafts)."""
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        q_lens, ctx_lens, last = [], [], []
        for seq, n, drafts, sample in zip(batch.seqs, batch.num_new_tokens, batch.drafts, batch.samples):
            start, q = seq.num_computed_tokens, n + len(drafts)
            ids += seq.token_ids[start:start + n] + drafts
            # planted: a prompt chunk after the first is rotated one position on
            shift = int(self.plant == "rope_off_by_one_chunk" and 0 < start < seq.num_prompt_tokens)
            pos += range(start + shift, start + q + shift)
            slots += self._slots(seq, start, start + q)
            q_lens.append(q)
            ctx_lens.append(start + q)
            if sample:  # the newest token's logits, and each draft's
                last += range(len(ids) - 1 - len(drafts), len(ids))
        ids_d, pos_d, slots_d, ctx_d, last_d = packed([ids, pos, slots, ctx_lens, last], torch.long, self.device)
        meta = AttnMeta(True, slots_d, self._block_tables(batch.seqs), ctx_d, max(ctx_lens), list(q_lens), ctx_lens)
        plan = getattr(self.model.attn, "plan", None)
        if plan is not None:
            plan(meta)
        return ids_d, pos_d, meta, last_d

    def _fused_varlen(self, meta) -> bool:
        """The fused element-wise kernels serve a varlen step too when its attention reads everything from
        the cache (the Triton varlen kernel): the fused layer writes K/V to the cache and keeps no copy."""
        return self.kernels.fused and meta.tiles is not None

    def _decode_inputs(self, seqs: list[Sequence]):
        """Plain Python on purpose: a decode step has one token a sequence, and a numpy array per sequence
        costs more than the arithmetic (this runs every step, on the host, while the GPU waits)."""
        bs = self.block_size
        ids, pos, slots, ctx = [], [], [], []
        for s in seqs:
            p = len(s) - 1
            ids.append(s.token_ids[-1])
            pos.append(p)
            w = p - 1 if self.plant == "stale_kv_slot" and p % 7 == 3 else p  # planted: the previous slot
            slots.append(s.block_table[w // bs] * bs + w % bs)
            ctx.append(p + 1)
        return ids, pos, slots, ctx

    def _query_rows(self, seqs: list[Sequence], tokens: list[int], positions: list[int]):
        """One decode query row per (sequence, token, position): the token's KV goes to its position's slot
        and its context ends there. A sequence may own several rows (its newest token and its drafts)."""
        bs = self.block_size
        slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, positions)]
        return tokens, positions, slots, [p + 1 for p in positions]

    def prepare_decode(self, seqs: list[Sequence], rows=None):
        """rows: (ids, positions, slots, context lens) of each query row, one row per sequence of `seqs`;
        default: each sequence's newest token."""
        ids, pos, slots, ctx = rows or self._decode_inputs(seqs)
        ids_d, pos_d, slots_d, ctx_d = packed([ids, pos, slots, ctx], torch.long, self.device)
        meta = AttnMeta(False, slots_d, self._block_tables(seqs), ctx_d.to(torch.int32), max(ctx))
        return ids_d, pos_d, meta, torch.arange(len(seqs), device=self.device)

    # --- the step ---
    def forward(self, batch: Batch) -> torch.Tensor:
        """float32 logits [sampled rows, vocab]: for each of batch.sampled_seqs in order, one row, or with
        drafts one row for its newest token and one for each draft."""
        if not batch.is_decode:
            with self._prepare():
                ids, pos, meta, last = self.prepare_varlen(batch)
            if self.piecewise is not None:
                logits = self.piecewise.run(ids, pos, meta, last, self.model.attn)
                if logits is not None:
                    return logits
            return self.model(ids, pos, meta, last, fused=self._fused_varlen(meta), skinny=self.kernels.skinny)
        seqs, rows = self._verify_rows(batch) if batch.has_drafts else (batch.seqs, None)
        bs = None if self.graphs is None else self.graphs.bucket(len(seqs))  # (verify: seqs lists one a row)
        if bs is not None:
            with self._prepare():
                self.graphs.fill(bs, *(rows or self._decode_inputs(seqs)), self._table_rows(seqs))
            return self.graphs.replay(bs, len(seqs))
        self.eager_decode_steps += 1
        with self._prepare():
            inputs = self.prepare_decode(seqs, rows)
        return self.model(*inputs, fused=self.kernels.fused, skinny=self.kernels.skinny)

    def _prepare(self):
        return self.timers.time("prepare") if self.timers is not None else nullcontext()

    def _verify_rows(self, batch: Batch):
        """A verify step as a decode step: a query row per token, each sequence's newest and then its drafts."""
        seqs, tokens, positions = [], [], []
        for s, drafts in zip(batch.seqs, batch.drafts):
            for j, tok in enumerate([s.last_token, *drafts]):
                seqs.append(s)
                tokens.append(tok)
                positions.append(len(s) - 1 + j)
        return seqs, self._query_rows(seqs, tokens, positions)

    def draft_logits(self, seqs: list[Sequence], tokens: list[int], positions: list[int],
                     num_layers: int) -> torch.Tensor:
        """float32 logits [len(seqs), vocab] of the model's first num_layers layers (then its final norm and
        head) for one token a sequence at the given positions, eagerly. It writes those layers' K/V at the
        positions' slots; the verify step that follows rewrites them with the whole model's."""
        rows = self._query_rows(seqs, tokens, positions)
        return self.model(*self.prepare_decode(seqs, rows), num_layers=num_layers)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]] | None = None) -> torch.Tensor:
        """A token per logits row, on the device: greedy where temperature is 0, else seeded sampling.
        With drafts (each sequence's rows: its newest token's, then one per draft), row j of a sequence
        sampling at temperature > 0 is draft j when accepted by rejection sampling, else a token drawn from
        the rest of the distribution (the last row: the extra token): a verified prefix keeps the target
        distribution exactly. Greedy rows are the argmax, so the drafts equal to it are the accepted ones."""
        out = logits.argmax(dim=-1)
        row = 0
        for i, seq in enumerate(seqs):
            d = drafts[i] if drafts else []
            if seq.params.temperature > 0:
                for j in range(len(d) + 1):
                    out[row + j] = self._sample_one(logits[row + j], seq, d[j] if j < len(d) else None)
            row += len(d) + 1
        return out

    def _sample_one(self, logits: torch.Tensor, seq: Sequence, draft: int | None = None) -> torch.Tensor:
        p: SamplingParams = seq.params
        gen = self.generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(p.seed if p.seed is not None else seq.seq_id)
            self.generators[seq.seq_id] = gen
        return draw(sampling_probs(logits, p), gen, draft)

    def release(self, seq: Sequence) -> None:
        self.generators.pop(seq.seq_id, None)


def table_rows_from_lists(seqs: list[Sequence]) -> torch.Tensor:
    """The sequences' block tables, padded with block 0 to the widest, converted from their lists whole."""
    rows = np.zeros((len(seqs), max(len(s.block_table) for s in seqs)), dtype=np.int32)
    for i, s in enumerate(seqs):
        rows[i, :len(s.block_table)] = s.block_table
    return torch.from_numpy(rows)


def draw(probs: torch.Tensor, gen: torch.Generator, draft: int | None = None) -> torch.Tensor:
    """A token from `probs`; given a draft, speculative sampling's acceptance: the draft was proposed with
    certainty (q = 1 at it), so it is kept with probability min(1, p(draft) / q(draft)) = p(draft), else a
    token is drawn from norm(max(0, p - q)): p with the draft taken out. The token is distributed as p."""
    if draft is not None:
        if torch.rand((), device=probs.device, generator=gen) < probs[draft]:
            return torch.tensor(draft, device=probs.device)
        probs = probs.clone()
        probs[draft] = 0.0
    return torch.multinomial(probs, 1, generator=gen)[0]


def sampling_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a token is drawn from: temperature, then top-k, then top-p."""
    logits = logits / p.temperature
    if p.top_k > 0:
        kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_p, idx = probs.sort(descending=True)
        drop = sorted_p.cumsum(0) - sorted_p > p.top_p
        probs = probs.scatter(0, idx, sorted_p.masked_fill(drop, 0.0))
    return probs
