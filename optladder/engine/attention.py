"""Attention over the KV cache. `flash_attn` is read once, where the engine calls `make_backend`.

Two kinds of step reach attention (optladder/engine/model_runner.py):
- decode: one query per sequence, at its last position (`decode`);
- varlen (`prefill`): each sequence's queries are the last `query_lens[i]` positions of its context of
  `context_lens_list[i]` tokens: whole prompts, prompt chunks whose earlier chunks are cached (chunked
  prefill), prompts whose prefix came from the prefix cache, and, in a mixed step, decode rows (one query).
  The layer stores the step's K/V in the cache before attention, so a query can read its whole context
  from the cache.

off: naive attention, written out: QKᵀ, mask, softmax, ·V, sequence by sequence (the baseline a user
     starts from).
on:  fused attention. On CUDA the project's Triton kernels over the paged cache: every varlen step (prompts,
     chunks, prefix hits, mixed steps) in one launch of optladder/engine/kernels/paged_prefill.py, decode steps
     through optladder/engine/kernels/paged_decode.py, which serves the contiguous cache too (one block per sequence).
     On CPU, PyTorch SDPA: the decode rows of a mixed step batched together, the other sequences one by one
     (with the flash kernel forced where SDPA runs on CUDA, so a fallback raises instead of running slowly).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from optladder.engine.kv_quant import QuantKV


@dataclass
class AttnMeta:
    """What one step's attention needs besides q, k, v. Built by the model runner."""

    is_prefill: bool
    slot_mapping: torch.Tensor  # [T] flat cache slot of each new token
    block_tables: torch.Tensor  # [B, max_blocks] (int32 or int64)
    context_lens: torch.Tensor  # [B] tokens in the cache after this step
    max_context_len: int
    query_lens: list[int] = field(default_factory=list)  # varlen: new tokens per sequence
    context_lens_list: list[int] = field(default_factory=list)  # varlen: total tokens per sequence
    # the Triton varlen kernel's inputs, set once per step by FusedAttention.plan where it will run
    query_start: torch.Tensor | None = None  # [B + 1] int32, cumulative query_lens
    tiles: tuple[torch.Tensor, torch.Tensor] | None = None  # int32 [num_tiles] each: sequence index, first query


def packed(parts: list[list[int]], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Several int lists to the device in one copy, each starting on a 16-byte boundary. Triton compiles a
    kernel per alignment of its pointer arguments: views at offsets that change with the step's size would
    make it compile again in the middle of a replay (a stall of a second or more), and run slower."""
    per = 16 // torch.empty((), dtype=dtype).element_size()
    sizes = [len(x) for x in parts]
    host: list[int] = []
    for x in parts:
        host += x
        host += [0] * (-len(x) % per)
    dev = torch.tensor(host, dtype=dtype).to(device)
    out, start = [], 0
    for n in sizes:
        out.append(dev[start:start + n])
        start += n + (-n % per)
    return out


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    if isinstance(k_cache, QuantKV):  # kv_fp8: quantized as it is written
        k_cache.store(k, slot_mapping)
        v_cache.store(v, slot_mapping)
        return
    kvh, d = k.shape[1], k.shape[2]
    k_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, v)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, max_len: int) -> torch.Tensor:
    """[num_blocks, block_size, kvh, d] -> [B, max_len, kvh, d] for the sequences' block tables."""
    if isinstance(cache, QuantKV):  # kv_fp8: dequantized to the model dtype
        return cache.gather(block_tables, max_len)
    bs = cache.shape[1]
    nb = (max_len + bs - 1) // bs
    if nb == 1:  # contiguous KV: one block per sequence, cut to the longest context first
        return cache[:, :max_len][block_tables[:, 0].long()]
    return cache[block_tables[:, :nb].long()].flatten(1, 2)[:, :max_len]


def _seq_kv(i: int, k: torch.Tensor, v: torch.Tensor, start: int, meta: AttnMeta, k_cache, v_cache):
    """The keys and values sequence i attends to: fresh ones, or its whole context from the cache
    when part of it came from the prefix cache."""
    q_len, ctx = meta.query_lens[i], meta.context_lens_list[i]
    if ctx == q_len:
        return k[start:start + q_len], v[start:start + q_len]
    table = meta.block_tables[i:i + 1]
    return gather_kv(k_cache, table, ctx)[0], gather_kv(v_cache, table, ctx)[0]


class NaiveAttention:
    name = "naive"

    def prefill(self, q, k, v, meta: AttnMeta, k_cache, v_cache) -> torch.Tensor:
        out, start = torch.empty_like(q), 0
        for i, q_len in enumerate(meta.query_lens):
            ks, vs = _seq_kv(i, k, v, start, meta, k_cache, v_cache)
            out[start:start + q_len] = self._attend(q[start:start + q_len].unsqueeze(0), ks.unsqueeze(0),
                                                    vs.unsqueeze(0), causal=True)[0]
            start += q_len
        return out

    def decode(self, q, meta: AttnMeta, k_cache, v_cache) -> torch.Tensor:
        ks = gather_kv(k_cache, meta.block_tables, meta.max_context_len)
        vs = gather_kv(v_cache, meta.block_tables, meta.max_context_len)
        pos = torch.arange(meta.max_context_len, device=q.device)
        valid = pos[None, :] < meta.context_lens[:, None]  # [B, L]
        return self._attend(q.unsqueeze(1), ks, vs, causal=False, valid=valid)[:, 0]

    @staticmethod
    def _attend(q, k, v, causal: bool, valid: torch.Tensor | None = None) -> torch.Tensor:
        """q [B, n, H, d], k/v [B, L, kvh, d] -> [B, n, H, d]; queries are the last n positions."""
        h, kvh = q.shape[2], k.shape[2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k, v = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])  # [B, H, n, L]
        n, length = q.shape[2], k.shape[2]
        if causal:
            future = torch.ones(n, length, dtype=torch.bool, device=q.device).triu(length - n + 1)
            scores = scores.masked_fill(future, float("-inf"))
        if valid is not None:
            scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return (probs @ v).transpose(1, 2)


class FusedAttention:
    """SDPA, and on CUDA the project's Triton kernels over the paged cache (see the module docstring)."""

    def __init__(self, device: torch.device, num_heads: int, num_kv_heads: int, triton: bool | None = None):
        """triton: the Triton kernels for decode and cached-context steps (default: on CUDA; the tests run
        them on CPU tensors through Triton's interpreter)."""
        self.cuda = device.type == "cuda"
        self.triton = self.cuda if triton is None else triton
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.name = "sdpa_flash" if self.cuda else "sdpa_cpu"
        self.decode_backend = "triton_paged" if self.triton else "sdpa"
        self.varlen_steps = 0  # steps that ran the varlen kernel: evidence for opts_effective

    def _sdpa(self, q, k, v, **kw):
        if not self.cuda:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)

    def plan(self, meta: AttnMeta) -> None:
        """Once per varlen step, where the Triton varlen kernel runs (CUDA): its tile list. It serves fresh
        prompts too: one launch for a step of many prompts, where SDPA takes one call per sequence."""
        if not self.triton:
            return
        from optladder.engine.kernels.paged_prefill import block_q, tile_list

        q_lens = meta.query_lens
        seq, first = tile_list(q_lens, block_q(self.num_heads, self.num_kv_heads))
        starts = [0]
        for n in q_lens:
            starts.append(starts[-1] + n)
        meta.query_start, tile_seq, tile_first = packed([starts, seq, first], torch.int32, meta.slot_mapping.device)
        meta.tiles = (tile_seq, tile_first)
        self.varlen_steps += 1

    def prefill(self, q, k, v, meta: AttnMeta, k_cache, v_cache) -> torch.Tensor:
        if meta.tiles is not None:
            from optladder.engine.kernels.paged_prefill import paged_prefill_attention

            return paged_prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start,
                                           meta.context_lens, meta.tiles)
        out = torch.empty_like(q)
        starts = [0]
        for n in meta.query_lens:
            starts.append(starts[-1] + n)
        decode_rows = [i for i, n in enumerate(meta.query_lens) if n == 1] if not self.triton else []
        if len(decode_rows) > 1:  # one batched call for the decode rows of a mixed step
            idx = torch.tensor([starts[i] for i in decode_rows], device=q.device)
            sub = AttnMeta(False, meta.slot_mapping, meta.block_tables[decode_rows],
                           meta.context_lens[decode_rows].to(torch.int32),
                           max(meta.context_lens_list[i] for i in decode_rows))
            out[idx] = self.decode(q[idx], sub, k_cache, v_cache)
        from torch.nn.attention.bias import causal_lower_right
        skip = set(decode_rows) if len(decode_rows) > 1 else set()
        for i, q_len in enumerate(meta.query_lens):
            if i in skip:
                continue
            start = starts[i]
            ks, vs = _seq_kv(i, k, v, start, meta, k_cache, v_cache)
            qs = q[start:start + q_len].transpose(0, 1)[None]
            ks, vs = ks.transpose(0, 1)[None], vs.transpose(0, 1)[None]
            if ks.shape[2] == q_len:
                o = self._sdpa(qs, ks, vs, is_causal=True)
            else:  # queries are the last q_len positions of the context
                o = self._sdpa(qs, ks, vs, attn_mask=causal_lower_right(q_len, ks.shape[2]))
            out[start:start + q_len] = o[0].transpose(0, 1)
        return out

    def decode(self, q, meta: AttnMeta, k_cache, v_cache) -> torch.Tensor:
        if self.triton:
            from optladder.engine.kernels.paged_decode import paged_decode_attention

            return paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens)
        ks = gather_kv(k_cache, meta.block_tables, meta.max_context_len).transpose(1, 2)
        vs = gather_kv(v_cache, meta.block_tables, meta.max_context_len).transpose(1, 2)
        pos = torch.arange(meta.max_context_len, device=q.device)
        valid = (pos[None, :] < meta.context_lens[:, None])[:, None, None, :]
        # padded batch with a mask: flash takes no mask, so SDPA picks among the masked kernels here
        return F.scaled_dot_product_attention(q.unsqueeze(2), ks, vs, attn_mask=valid,
                                              enable_gqa=True).squeeze(2)


def make_backend(flash_attn: bool, device: torch.device, num_heads: int, num_kv_heads: int):
    return FusedAttention(device, num_heads, num_kv_heads) if flash_attn else NaiveAttention()
