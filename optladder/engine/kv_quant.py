"""The KV cache in FP8 (`kv_fp8`): E4M3 values with one float16 scale per token and KV head.

A `QuantKV` takes the place of a layer's k_cache or v_cache tensor when the opt is on; the code that writes
and reads the cache asks it to: `store` quantizes a step's keys or values as they are written
(optladder/engine/attention.py's store_kv), `gather` dequantizes the blocks a naive or SDPA step reads, and the
Triton paged-decode kernel reads the E4M3 values and their scales directly, so a decode step reads half
the KV bytes. Per token and head, the scale is max|x| / 448 over the head's dimensions, so a token with loud
keys costs no other token its precision. K and V then cost 2 x (head_dim + 2) bytes a head and token,
against 2 x 2 x head_dim in bf16: 0.52x for head_dim 64 (SmolLM2), 0.51x for 128 (Llama-3-8B).

Prefill attends to the step's fresh keys and values, as vLLM's fp8 cache does; decode steps, and anything
that reads context back from the cache, see the quantized ones. The opt is read once, in the engine, which
sizes the KV budget with `kv_fp8_bytes_per_token` and has the runner allocate `QuantKV`s.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALE_DTYPE = torch.float16
MIN_SCALE = 2.0 ** -24  # float16's smallest subnormal: an all-zero head still divides by something


def kv_fp8_bytes_per_token(shape) -> int:
    """K and V of every layer for one token: E4M3 values and a float16 scale per KV head."""
    per_head = shape.head_dim + torch.finfo(SCALE_DTYPE).bits // 8
    return 2 * shape.num_hidden_layers * shape.num_key_value_heads * per_head


@dataclass
class QuantKV:
    data: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim] float8_e4m3fn
    scale: torch.Tensor  # [num_blocks, block_size, kv_heads] float16
    dtype: torch.dtype  # what the model computes in: gathered blocks come back in it

    @classmethod
    def zeros(cls, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
              device: torch.device) -> "QuantKV":
        return cls(torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=FP8, device=device),
                   torch.zeros(num_blocks, block_size, kv_heads, dtype=SCALE_DTYPE, device=device), dtype)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def store(self, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """x [T, kv_heads, head_dim] written to flat slots, quantized per token and head."""
        kvh, d = x.shape[1], x.shape[2]
        xf = x.float()
        scale = (xf.abs().amax(dim=-1) / FP8_MAX).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
        q = (xf / scale.float()[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        # index_copy_ has no float8 kernel on every device: copy the bytes
        self.data.view(torch.uint8).view(-1, kvh, d).index_copy_(0, slot_mapping, q.view(torch.uint8))
        self.scale.view(-1, kvh).index_copy_(0, slot_mapping, scale)

    def dequantize(self, data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return (data.float() * scale.float()[..., None]).to(self.dtype)

    def gather(self, block_tables: torch.Tensor, max_len: int) -> torch.Tensor:
        """[B, max_len, kv_heads, head_dim] in the model dtype, as attention.gather_kv returns a dense cache."""
        bs = self.data.shape[1]
        nb = (max_len + bs - 1) // bs
        if nb == 1:  # contiguous KV: one block per sequence
            rows = block_tables[:, 0].long()
            return self.dequantize(self.data[:, :max_len][rows], self.scale[:, :max_len][rows])
        idx = block_tables[:, :nb].long()
        return self.dequantize(self.data[idx].flatten(1, 2)[:, :max_len], self.scale[idx].flatten(1, 2)[:, :max_len])


def rope_store_kv_fp8(qkv: torch.Tensor, positions, cos, sin, slot_mapping, k_cache: QuantKV, v_cache: QuantKV,
                      num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """The fused decode step's rotary-and-store (optladder/engine/kernels/fused.py) into an fp8 cache: the kernel writes
    the rotated keys and the values of the step's T tokens to a dense scratch cache of T slots, which are
    then quantized into their real slots. Graph-capturable: no host value is read."""
    from optladder.engine.kernels import fused

    t = qkv.shape[0]
    k_tmp = torch.empty(t, 1, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    v_tmp = torch.empty_like(k_tmp)
    scratch = torch.arange(t, device=qkv.device)
    q = fused.rope_store_kv(qkv, positions, cos, sin, scratch, k_tmp, v_tmp, num_heads, num_kv_heads, head_dim)
    k_cache.store(k_tmp[:, 0], slot_mapping)
    v_cache.store(v_tmp[:, 0], slot_mapping)
    return q
