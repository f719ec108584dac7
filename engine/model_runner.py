"""The only part of the engine that touches the device each step: KV cache tensors, input preparation,
the forward pass and sampling. `cuda_graphs` is read here, once: decode steps then replay captured graphs
(engine/cuda_graphs.py) and fall back to the eager forward only for a batch above the largest bucket."""
from __future__ import annotations

import torch

from engine.attention import AttnMeta, make_backend
from engine.config import EngineConfig
from engine.kv_quant import QuantKV
from engine.model import LlamaModel, LlamaShape
from engine.sequence import SamplingParams, Sequence


def kv_bytes_per_token(model: LlamaModel | LlamaShape, dtype: torch.dtype) -> int:
    shape = model.shape if isinstance(model, LlamaModel) else model
    return shape.kv_bytes_per_token(torch.finfo(dtype).bits // 8)


class ModelRunner:
    def __init__(self, model: LlamaModel, device: torch.device, dtype: torch.dtype, num_blocks: int,
                 block_size: int, cfg: EngineConfig, kv_fp8: bool = False):
        """kv_fp8: the cache as engine/kv_quant.py's QuantKV (E4M3 with scales), as the engine decided."""
        self.model, self.device, self.dtype = model, device, dtype
        self.block_size = block_size
        s = model.shape
        # under graphs one block more than the block manager knows: the padding rows' dummy slot
        pool_blocks = num_blocks + 1 if cfg.cuda_graphs else num_blocks
        for layer in model.layers:
            # zeros, not empty: masked-out slots are multiplied by 0 in attention, and 0 * NaN is NaN
            if kv_fp8:
                layer.k_cache, layer.v_cache = (QuantKV.zeros(pool_blocks, block_size, s.num_key_value_heads,
                                                              s.head_dim, dtype, device) for _ in range(2))
                continue
            layer.k_cache = torch.zeros(pool_blocks, block_size, s.num_key_value_heads, s.head_dim,
                                        dtype=dtype, device=device)
            layer.v_cache = torch.zeros_like(layer.k_cache)
        model.attn = make_backend(cfg.flash_attn, device, cfg.paged_kv)
        self.generators: dict[int, torch.Generator] = {}
        self.graphs = None
        if cfg.cuda_graphs:
            from engine.cuda_graphs import CUDAGraphRunner

            self.graphs = CUDAGraphRunner(model, device, max(cfg.batch_size, cfg.max_num_seqs),
                                          cfg.max_model_len, block_size, dummy_block=num_blocks)

    @property
    def attention_backend(self) -> str:
        """The prefill backend, then the decode one; graph-replayed decode names its own kernel."""
        attn = self.model.attn
        name = attn.name if not hasattr(attn, "decode_backend") else f"{attn.name}+{attn.decode_backend}"
        return name if self.graphs is None else f"{name} (graph decode: {self.graphs.attn.name})"

    def _slot(self, seq: Sequence, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max(len(s.block_table) for s in seqs)
        rows = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
        return torch.tensor(rows, dtype=torch.int32, device=self.device)

    def prepare_prefill(self, seqs: list[Sequence]):
        ids, pos, slots, q_lens, ctx_lens = [], [], [], [], []
        for seq in seqs:
            start = seq.num_cached_tokens
            ids += seq.token_ids[start:]
            pos += range(start, len(seq))
            slots += [self._slot(seq, p) for p in range(start, len(seq))]
            q_lens.append(len(seq) - start)
            ctx_lens.append(len(seq))
        t = lambda x: torch.tensor(x, dtype=torch.long, device=self.device)  # noqa: E731
        meta = AttnMeta(True, t(slots), self._block_tables(seqs), t(ctx_lens), max(ctx_lens), q_lens, ctx_lens)
        last = torch.tensor(q_lens, device=self.device).cumsum(0) - 1
        return t(ids), t(pos), meta, last

    def _decode_inputs(self, seqs: list[Sequence]):
        ids = [s.last_token for s in seqs]
        pos = [len(s) - 1 for s in seqs]
        slots = [self._slot(s, p) for s, p in zip(seqs, pos)]
        return ids, pos, slots, [len(s) for s in seqs]

    def prepare_decode(self, seqs: list[Sequence]):
        ids, pos, slots, ctx = self._decode_inputs(seqs)
        t = lambda x: torch.tensor(x, dtype=torch.long, device=self.device)  # noqa: E731
        meta = AttnMeta(False, t(slots), self._block_tables(seqs), t(ctx).to(torch.int32), max(ctx))
        return t(ids), t(pos), meta, torch.arange(len(seqs), device=self.device)

    def forward(self, seqs: list[Sequence], is_prefill: bool) -> torch.Tensor:
        if not is_prefill and self.graphs is not None:
            width = max(len(s.block_table) for s in seqs)
            tables = torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs],
                                  dtype=torch.int32)
            logits = self.graphs.run(*self._decode_inputs(seqs), tables)
            if logits is not None:
                return logits
        prep = self.prepare_prefill(seqs) if is_prefill else self.prepare_decode(seqs)
        return self.model(*prep)

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
