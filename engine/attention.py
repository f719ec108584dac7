"""Attention over the KV cache. `flash_attn` is read once, in `make_backend`.

off: naive attention, written out: QKᵀ, mask, softmax, ·V (the baseline a user starts from).
on:  fused attention: PyTorch SDPA; on CUDA the flash kernel is forced for prefill, so a fallback to a
     slower kernel raises instead of running silently; decode over the paged cache runs the project's
     Triton kernel (engine/kernels/paged_decode.py) where it is available.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.kv_quant import QuantKV


@dataclass
class AttnMeta:
    """What one step's attention needs besides q, k, v. Built by the model runner."""

    is_prefill: bool
    slot_mapping: torch.Tensor  # [T] flat cache slot of each new token
    block_tables: torch.Tensor  # [B, max_blocks] (int32 or int64)
    context_lens: torch.Tensor  # [B] tokens in the cache after this step
    max_context_len: int
    query_lens: list[int] = field(default_factory=list)  # prefill: new tokens per sequence
    context_lens_list: list[int] = field(default_factory=list)  # prefill: total tokens per sequence


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
    """SDPA. On CUDA prefill runs only the flash kernel: if it cannot, SDPA raises."""

    def __init__(self, device: torch.device, paged_decode=None):
        self.cuda = device.type == "cuda"
        self.paged_decode = paged_decode  # Triton kernel for the paged cache on CUDA, or None
        self.name = "sdpa_flash" if self.cuda else "sdpa_cpu"
        self.decode_backend = "triton_paged" if paged_decode else "sdpa"

    def _sdpa(self, q, k, v, **kw):
        if not self.cuda:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)

    def prefill(self, q, k, v, meta: AttnMeta, k_cache, v_cache) -> torch.Tensor:
        from torch.nn.attention.bias import causal_lower_right
        out, start = torch.empty_like(q), 0
        for i, q_len in enumerate(meta.query_lens):
            ks, vs = _seq_kv(i, k, v, start, meta, k_cache, v_cache)
            qs = q[start:start + q_len].transpose(0, 1)[None]
            ks, vs = ks.transpose(0, 1)[None], vs.transpose(0, 1)[None]
            if ks.shape[2] == q_len:
                o = self._sdpa(qs, ks, vs, is_causal=True)
            else:  # queries are the last q_len positions of the context
                o = self._sdpa(qs, ks, vs, attn_mask=causal_lower_right(q_len, ks.shape[2]))
            out[start:start + q_len] = o[0].transpose(0, 1)
            start += q_len
        return out

    def decode(self, q, meta: AttnMeta, k_cache, v_cache) -> torch.Tensor:
        if self.paged_decode is not None:
            return self.paged_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens)
        ks = gather_kv(k_cache, meta.block_tables, meta.max_context_len).transpose(1, 2)
        vs = gather_kv(v_cache, meta.block_tables, meta.max_context_len).transpose(1, 2)
        pos = torch.arange(meta.max_context_len, device=q.device)
        valid = (pos[None, :] < meta.context_lens[:, None])[:, None, None, :]
        # padded batch with a mask: flash takes no mask, so SDPA picks among the masked kernels here
        return F.scaled_dot_product_attention(q.unsqueeze(2), ks, vs, attn_mask=valid,
                                              enable_gqa=True).squeeze(2)


def make_backend(flash_attn: bool, device: torch.device, paged: bool):
    if not flash_attn:
        return NaiveAttention()
    paged_decode = None
    if paged and device.type == "cuda":
        from engine.kernels.paged_decode import paged_decode_attention
        paged_decode = paged_decode_attention
    return FusedAttention(device, paged_decode)
