"""The only part of the engine that touches the device each step: KV cache tensors, input preparation,
the forward pass and sampling.

A step is a `Batch` (engine/scheduler.py): each sequence computes its next `num_new_tokens` tokens.
- all of them one decode token: the decode path (graph replay when the engine built a CUDAGraphRunner,
  the fused decode kernels when `DecodeKernels` says so, else the eager layer);
- anything else (whole prompts, prompt chunks, or chunks mixed with decode rows): the varlen path, each
  sequence's queries the last positions of its context, attention over the paged cache.
Logits come back only for the sequences that get a token this step (a prompt chunk gets none).
"""
from __future__ import annotations

import numpy as np
import torch

from engine.attention import AttnMeta
from engine.block_manager import KVLayout
from engine.model import DecodeKernels, LlamaModel, LlamaShape
from engine.scheduler import Batch
from engine.sequence import SamplingParams, Sequence


def kv_bytes_per_token(model: LlamaModel | LlamaShape, dtype: torch.dtype) -> int:
    shape = model.shape if isinstance(model, LlamaModel) else model
    return shape.kv_bytes_per_token(torch.finfo(dtype).bits // 8)


class ModelRunner:
    def __init__(self, model: LlamaModel, device: torch.device, dtype: torch.dtype, layout: KVLayout, attn,
                 kernels: DecodeKernels = DecodeKernels(), graph_max_batch: int | None = None,
                 max_model_len: int = 2048):
        """graph_max_batch: capture decode steps in CUDA graphs up to this batch (None: no graphs)."""
        self.model, self.device, self.dtype = model, device, dtype
        self.block_size = layout.block_size
        self.kernels = kernels
        s = model.shape
        # under graphs one block more than the block manager knows: the padding rows' dummy slot
        pool_blocks = layout.num_blocks + (graph_max_batch is not None)
        for layer in model.layers:
            # zeros, not empty: masked-out slots are multiplied by 0 in attention, and 0 * NaN is NaN
            layer.k_cache = torch.zeros(pool_blocks, layout.block_size, s.num_key_value_heads, s.head_dim,
                                        dtype=dtype, device=device)
            layer.v_cache = torch.zeros_like(layer.k_cache)
        model.attn = attn
        self.generators: dict[int, torch.Generator] = {}
        self.eager_decode_steps = 0  # decode steps run outside graphs (through the fused kernels if on)
        self.graphs = None
        if graph_max_batch is not None:
            from engine.cuda_graphs import CUDAGraphRunner

            self.graphs = CUDAGraphRunner(model, device, graph_max_batch, max_model_len, layout.block_size,
                                          dummy_block=layout.num_blocks, kernels=kernels)

    @property
    def attention_backend(self) -> str:
        """The prefill backend, then the decode one; graph-replayed decode names its own kernel."""
        attn = self.model.attn
        name = attn.name if not hasattr(attn, "decode_backend") else f"{attn.name}+{attn.decode_backend}"
        return name if self.graphs is None else f"{name} (graph decode: {self.graphs.attn.name})"

    # --- inputs ---
    @staticmethod
    def _table_rows(seqs: list[Sequence]) -> torch.Tensor:
        """The sequences' block tables, padded with block 0 to the widest, on the host."""
        rows = np.zeros((len(seqs), max(len(s.block_table) for s in seqs)), dtype=np.int32)
        for i, s in enumerate(seqs):
            rows[i, :len(s.block_table)] = s.block_table
        return torch.from_numpy(rows)

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        return self._table_rows(seqs).to(self.device)

    def _slots(self, seq: Sequence, start: int, end: int) -> np.ndarray:
        pos = np.arange(start, end)
        return np.asarray(seq.block_table, dtype=np.int64)[pos // self.block_size] * self.block_size \
            + pos % self.block_size

    def prepare_varlen(self, batch: Batch):
        """Token ids, positions, attention metadata and the rows whose logits are needed, for a step of
        variable-length queries (each sequence's next num_new_tokens tokens)."""
        ids, pos, slots = [], [], []
        q_lens, ctx_lens = batch.num_new_tokens, []
        for seq, n in zip(batch.seqs, q_lens):
            start = seq.num_computed_tokens
            ids.append(np.asarray(seq.token_ids[start:start + n], dtype=np.int64))
            pos.append(np.arange(start, start + n, dtype=np.int64))
            slots.append(self._slots(seq, start, start + n))
            ctx_lens.append(start + n)
        ends = np.cumsum(q_lens)
        last = (ends - 1)[np.asarray(batch.samples)]
        t = int(ends[-1])
        host = np.concatenate([*ids, *pos, *slots, np.asarray(ctx_lens, dtype=np.int64), last])
        dev = torch.from_numpy(host).to(self.device)  # one host-to-device copy for all of it
        b = len(ctx_lens)
        meta = AttnMeta(True, dev[2 * t:3 * t], self._block_tables(batch.seqs), dev[3 * t:3 * t + b],
                        max(ctx_lens), list(q_lens), ctx_lens)
        plan = getattr(self.model.attn, "plan", None)
        if plan is not None:
            plan(meta)
        return dev[:t], dev[t:2 * t], meta, dev[3 * t + b:]

    def _decode_inputs(self, seqs: list[Sequence]):
        ids = [s.last_token for s in seqs]
        pos = [len(s) - 1 for s in seqs]
        slots = [int(self._slots(s, p, p + 1)[0]) for s, p in zip(seqs, pos)]
        return ids, pos, slots, [len(s) for s in seqs]

    def prepare_decode(self, seqs: list[Sequence]):
        ids, pos, slots, ctx = self._decode_inputs(seqs)
        dev = torch.tensor([ids, pos, slots, ctx], dtype=torch.long).to(self.device)
        meta = AttnMeta(False, dev[2], self._block_tables(seqs), dev[3].to(torch.int32), max(ctx))
        return dev[0], dev[1], meta, torch.arange(len(seqs), device=self.device)

    # --- the step ---
    def forward(self, batch: Batch) -> torch.Tensor:
        """float32 logits [number of sampled sequences, vocab], in the order of batch.sampled_seqs."""
        if not batch.is_decode:
            return self.model(*self.prepare_varlen(batch))
        seqs = batch.seqs
        if self.graphs is not None:
            logits = self.graphs.run(*self._decode_inputs(seqs), self._table_rows(seqs))
            if logits is not None:
                return logits
        self.eager_decode_steps += 1
        return self.model(*self.prepare_decode(seqs), fused=self.kernels.fused, skinny=self.kernels.skinny)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Next token per sequence, on the device: greedy where temperature is 0, else seeded sampling."""
        out = logits.argmax(dim=-1)
        for i, seq in enumerate(seqs):
            if seq.params.temperature > 0:
                out[i] = self._sample_one(logits[i], seq)
        return out

    def _sample_one(self, logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
        p: SamplingParams = seq.params
        gen = self.generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(p.seed if p.seed is not None else seq.seq_id)
            self.generators[seq.seq_id] = gen
        logits = logits / p.temperature
        if p.top_k > 0:
            kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_p, idx = probs.sort(descending=True)
            drop = sorted_p.cumsum(0) - sorted_p > p.top_p
            probs = probs.scatter(0, idx, sorted_p.masked_fill(drop, 0.0))
        return torch.multinomial(probs, 1, generator=gen)[0]

    def release(self, seq: Sequence) -> None:
        self.generators.pop(seq.seq_id, None)
