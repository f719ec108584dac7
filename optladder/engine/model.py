"""A Llama-family decoder in plain PyTorch, over a flat batch of tokens and a block KV cache.

Weights load from Hugging Face safetensors (q/k/v and gate/up fused at load time), or are drawn at
random on the device for tests and speed work. Attention is delegated to the backend the engine chose
(optladder/engine/attention.py).

`forward(..., fused=True)` runs a decode step's layers through the fused Triton kernels of
optladder/engine/kernels/fused.py (6 small kernels a layer instead of ~30: `fused_kernels`), and with skinny=True the
linear layers through optladder/engine/kernels/gemv.py (SiLU·mul folded in: 5; `skinny_gemm`), eagerly or inside the
graphs of optladder/engine/cuda_graphs.py. It needs Triton, so a CUDA device or Triton's interpreter.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from itertools import islice

import torch
from torch import nn

from optladder.engine.attention import AttnMeta, store_kv
from optladder.engine.kv_quant import QuantKV, rope_store_kv_fp8


@cache
def _fused_kernels():
    """optladder/engine/kernels/fused.py and the skinny GEMM, imported on first use (they need Triton) and then looked up
    once per call site, not imported again per linear layer on the step's hot path."""
    from optladder.engine.kernels import fused
    from optladder.engine.kernels.gemv import decode_linear

    return fused, decode_linear


@dataclass(frozen=True)
class DecodeKernels:
    """Which kernels a decode step runs: fused element-wise kernels (fused_kernels) and the skinny GEMM
    (skinny_gemm), resolved once by the engine from its switches."""

    fused: bool = False
    skinny: bool = False


@dataclass
class LlamaShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """K and V of every layer for one token: what one KV slot costs."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * bytes_per_element

    @property
    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        qkv = h * (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        layer = qkv + o + 3 * h * i + 2 * h
        return v * h * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer + h


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, max_pos: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions, q, k):
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class DecoderLayer(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.nh, self.nkv, self.hd = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.qkv_proj = nn.Linear(s.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, s.hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.gate_up_proj = nn.Linear(s.hidden_size, 2 * s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)
        self.k_cache: torch.Tensor | None = None  # [num_blocks, block_size, nkv, hd], set by the runner
        self.v_cache: torch.Tensor | None = None

    def forward(self, x, positions, meta: AttnMeta, rotary: Rotary, attn) -> torch.Tensor:
        q, k, v = self.pre_attention(x, positions, meta.slot_mapping, rotary)
        if meta.is_prefill:
            o = attn.prefill(q, k, v, meta, self.k_cache, self.v_cache)
        else:
            o = attn.decode(q, meta, self.k_cache, self.v_cache)
        return self.post_attention(x, o)

    # the layer in two pieces around attention, which optladder/engine/piecewise.py captures in graphs of their own
    def pre_attention(self, x, positions, slot_mapping, rotary: Rotary):
        """RMSNorm, the QKV projection and rotary; stores K/V at the slots. Returns q, k, v [t, heads, hd]."""
        t = x.shape[0]
        qkv = self.qkv_proj(self.input_layernorm(x))
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q, k = rotary(positions, q.view(t, self.nh, self.hd), k.view(t, self.nkv, self.hd))
        v = v.view(t, self.nkv, self.hd)
        store_kv(k, v, self.k_cache, self.v_cache, slot_mapping)
        return q, k, v

    def post_attention(self, x, o) -> torch.Tensor:
        """The output projection and residual, then the MLP block and its residual."""
        x = x + self.o_proj(o.reshape(x.shape[0], self.nh * self.hd))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(nn.functional.silu(gate) * up)

    def forward_fused(self, x, residual, positions, meta: AttnMeta, rotary: Rotary, attn, skinny: bool):
        """The same layer with fused element-wise kernels; the residual add of each sub-layer is done
        inside the next RMSNorm, so this returns (the MLP output, the residual stream before it).
        skinny: the linear layers through optladder/engine/kernels/gemv.py (SiLU·mul in the gate/up product)."""
        q, residual = self.pre_attention_fused(x, residual, positions, meta.slot_mapping, rotary, skinny)
        # a varlen step reaches here only when its attention reads K/V from the cache (model_runner.py)
        o = attn.prefill(q, None, None, meta, self.k_cache, self.v_cache) if meta.is_prefill else \
            attn.decode(q, meta, self.k_cache, self.v_cache)
        return self.post_attention_fused(o, residual, skinny)

    def _linear(self, mod: nn.Linear, h, skinny: bool, silu_mul: bool = False):
        fused, decode_linear = _fused_kernels()
        if skinny and isinstance(mod, nn.Linear):  # a quantized layer (optladder/engine/quant.py) runs its own kernel
            return decode_linear(h, mod.weight, silu_mul)
        return fused.silu_mul(mod(h)) if silu_mul else mod(h)

    # the fused layer in two pieces around attention (optladder/engine/piecewise.py captures them with fused_kernels)
    def pre_attention_fused(self, x, residual, positions, slot_mapping, rotary: Rotary, skinny: bool):
        """add+RMSNorm, the QKV projection, rotary and the K/V store in one kernel. Returns (q [t, heads, hd],
        the residual stream)."""
        fused, _ = _fused_kernels()
        h, residual = fused.add_rmsnorm(x, residual, self.input_layernorm.weight, self.input_layernorm.eps)
        store = rope_store_kv_fp8 if isinstance(self.k_cache, QuantKV) else fused.rope_store_kv  # kv_fp8
        q = store(self._linear(self.qkv_proj, h, skinny), positions, rotary.cos, rotary.sin, slot_mapping,
                  self.k_cache, self.v_cache, self.nh, self.nkv, self.hd)
        return q, residual

    def post_attention_fused(self, o, residual, skinny: bool):
        """The output projection, add+RMSNorm, the MLP (SiLU·mul fused). Returns (the MLP output, the
        residual stream before it)."""
        fused, _ = _fused_kernels()
        t = o.shape[0]
        h, residual = fused.add_rmsnorm(self._linear(self.o_proj, o.reshape(t, self.nh * self.hd), skinny), residual,
                                        self.post_attention_layernorm.weight, self.post_attention_layernorm.eps)
        return self._linear(self.down_proj, self._linear(self.gate_up_proj, h, skinny, silu_mul=True), skinny), residual


class LlamaModel(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_hidden_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        if shape.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = Rotary(shape.head_dim, shape.max_position_embeddings, shape.rope_theta)
        self.attn = None  # the attention backend, set by the runner

    @torch.inference_mode()
    def forward(self, input_ids, positions, meta: AttnMeta, logits_indices, attn=None,
                fused: bool = False, skinny: bool = False, num_layers: int | None = None) -> torch.Tensor:
        """input_ids/positions [T] -> float32 logits [len(logits_indices), vocab].
        attn: an attention backend other than self.attn (the graph-safe decode of optladder/engine/cuda_graphs.py);
        fused: through the fused kernels (a decode step, or a varlen step whose attention reads the cache);
        skinny: and the linear layers of up to 16 rows through the skinny-GEMM kernel;
        num_layers: only the first layers, then the final norm and head (speculative decoding's draft)."""
        attn = attn or self.attn
        x = self.embed_tokens(input_ids)
        layers = self.layers if num_layers is None else islice(self.layers, num_layers)
        residual = None
        for layer in layers:
            if fused:
                x, residual = layer.forward_fused(x, residual, positions, meta, self.rotary, attn, skinny)
            else:
                x = layer(x, positions, meta, self.rotary, attn)
        return self.head(x, residual, logits_indices, fused, skinny)

    def head(self, x, residual, logits_indices, fused: bool = False, skinny: bool = False) -> torch.Tensor:
        """The final norm and the head on the rows logits_indices picks: float32 logits. fused: after the fused
        layers, whose last output and residual stream the fused add+RMSNorm sums; skinny: and the head through
        the skinny GEMM. Shared by forward and the piecewise steps (optladder/engine/piecewise.py)."""
        if not fused:
            return self.lm_head(self.norm(x[logits_indices])).float()
        kernels, decode_linear = _fused_kernels()
        x = kernels.add_rmsnorm(x, residual, self.norm.weight, self.norm.eps)[0][logits_indices]
        return (decode_linear(x, self.lm_head.weight) if skinny else self.lm_head(x)).float()

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Hugging Face Llama names -> this module (fusing q/k/v and gate/up)."""
        own: dict[str, torch.Tensor] = {}
        for key, t in sd.items():
            key = key.removeprefix("model.")
            if ".self_attn.q_proj." in key:
                i = key.split(".")[1]
                own[f"layers.{i}.qkv_proj.weight"] = torch.cat([
                    t, sd[f"model.layers.{i}.self_attn.k_proj.weight"],
                    sd[f"model.layers.{i}.self_attn.v_proj.weight"]])
            elif ".mlp.gate_proj." in key:
                i = key.split(".")[1]
                own[f"layers.{i}.gate_up_proj.weight"] = torch.cat([t, sd[f"model.layers.{i}.mlp.up_proj.weight"]])
            elif any(s in key for s in (".k_proj.", ".v_proj.", ".up_proj.", "rotary_emb")):
                continue
            else:
                own[key.replace("self_attn.o_proj", "o_proj").replace("mlp.down_proj", "down_proj")] = t
        if self.shape.tie_word_embeddings:
            own.pop("lm_head.weight", None)
            own["lm_head.weight"] = own["embed_tokens.weight"]
        missing, unexpected = self.load_state_dict(own, strict=False)
        missing = [m for m in missing if not m.startswith("rotary")]
        if missing or unexpected:
            raise ValueError(f"checkpoint does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
