"""Piecewise CUDA graphs for steps with prompt tokens (`piecewise_graphs`, which needs cuda_graphs;
ModelRunner reads what the engine decided, once, where it builds this).

A varlen step (whole prompts, prompt chunks, chunked prefill's mixed steps) cannot replay one graph: its
attention depends on host values that change every step (each sequence's query and context lengths). The
rest of a layer does not: norms, projections, rotary, the KV store and the MLP are row-wise over the step's
tokens. So each layer is cut around attention (DecoderLayer.pre_attention / post_attention, or with
fused_kernels pre_attention_fused / post_attention_fused, the fused kernels' pieces) and, per bucket of token
counts (16, 32, 64, 128, then four a doubling: 160, 192, 224, 256, 320, ... up to engine.piecewise_max_tokens,
so a step of more than 128 tokens pads by at most a quarter), the pieces between two attentions are captured as
one graph: the embedding and layer 0's pre-attention; layer i's post-attention and layer i+1's
pre-attention; the last layer's post-attention. A step of n tokens pads to the smallest bucket >= n and runs
num_layers + 1 replays with the attention of each layer eagerly in between (the same backend call an eager
step makes, on the step's n real rows), then the final norm and head on the sampled rows. Eagerly, a layer
is ~15 PyTorch kernels launched one by one from Python; here it is one replay and one attention call.

Padding rows (n .. bucket) embed whatever token ids and positions an earlier step left in the buffers (valid
ones; zeros at first) and store their K/V at the dummy slot that decode graphs use (a block the pool keeps out of
the block manager; the slots are reset every step), so they touch no live sequence; their
attention output rows are whatever a finite earlier step left (the buffer starts at zero): each row of the
pieces depends on its own row only, and no padding row reaches the logits. A step of more tokens than the
largest bucket runs eagerly and is counted.

With fused_kernels the pieces are the fused layer's, whose attention reads K/V from the cache: a step without
the Triton varlen kernel's tiles (no flash_attn on CUDA) then runs eagerly, counted. Quantized weights and
kv_fp8 are refused with piecewise_graphs at validation. On a CPU (tests) the same pieces run without capture
(the fused ones through Triton's interpreter), so the cutting, padding and buffers are checked there against
the unpiecewise forward. The teacher-forced scorer (optladder/engine/scoring.py) runs the model without the pieces, so an
A/B of this switch decides quality by exact match.

Measured on the H200 (benchmarks/results/gpu_piecewise_h200.md), the first version (the plain layer's
pieces, power-of-two buckets up to 8,192, beside fused_kernels' eager steps) made mixed steps slower, not
faster: see there before turning it on.
"""
from __future__ import annotations

import time

import torch

from optladder.engine.attention import AttnMeta
from optladder.engine.model import DecodeKernels, LlamaModel

MIN_BUCKET = 16
FINE_FROM = 128  # from here four buckets a doubling, so padding costs at most a quarter of a large step


def token_buckets(max_tokens: int) -> list[int]:
    """16, 32, 64, 128, then 160, 192, 224, 256, 320, ... (four a doubling) below max_tokens, and max_tokens."""
    assert max_tokens >= 1
    out, b = [], MIN_BUCKET
    while b < max_tokens:
        out.append(b)
        b = b * 2 if b < FINE_FROM else b + (1 << (b.bit_length() - 1)) // 4
    return out + [max_tokens]


class PiecewiseGraphRunner:
    def __init__(self, model: LlamaModel, device: torch.device, max_tokens: int, dummy_slot: int,
                 kernels: DecodeKernels = DecodeKernels(), capture: bool = True):
        """kernels: fused: the fused layer's pieces (skinny: its linear layers of up to 16 rows through the
        GEMV); capture: record the pieces as CUDA graphs (CUDA only); False runs them eagerly (a CPU check)."""
        assert not capture or device.type == "cuda"
        self.model, self.device, self.capture = model, device, capture
        self.fused, self.skinny = kernels.fused, kernels.skinny
        self.buckets = token_buckets(max_tokens)
        self.dummy_slot = dummy_slot
        s, size = model.shape, self.buckets[-1]
        dtype = model.embed_tokens.weight.dtype
        self.nh, self.nkv, self.hd = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        # the static buffers every piece reads or writes (one set, sliced per bucket)
        self.ints = torch.zeros(3, size, dtype=torch.long, device=device)  # input ids, positions, slots
        self.ints[2].fill_(dummy_slot)
        self.x = torch.zeros(size, s.hidden_size, dtype=dtype, device=device)
        self.residual = torch.zeros_like(self.x)  # fused pieces: the residual stream beside x
        self.q = torch.zeros(size, self.nh, self.hd, dtype=dtype, device=device)
        self.k = torch.zeros(size, self.nkv, self.hd, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.o = torch.zeros(size, self.nh * self.hd, dtype=dtype, device=device)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.replays = 0  # steps run piecewise
        self.eager_fallbacks = 0  # steps of more tokens than the largest bucket
        self.untiled_fallbacks = 0  # fused pieces: steps whose attention does not read the cache (no tiles)
        self.capture_s = 0.0
        if capture:
            self._capture()

    @torch.inference_mode()
    def _piece(self, i: int, t: int) -> None:
        """Piece i of a bucket of t tokens: layer i-1's post-attention (none for i = 0: the embedding), then
        layer i's pre-attention (none for the last piece)."""
        if self.fused:
            return self._piece_fused(i, t)
        layers = self.model.layers
        ids, pos, slots = self.ints[0, :t], self.ints[1, :t], self.ints[2, :t]
        if i == 0:
            self.x[:t].copy_(self.model.embed_tokens(ids))
        else:
            self.x[:t].copy_(layers[i - 1].post_attention(self.x[:t], self.o[:t]))
        if i < len(layers):
            q, k, v = layers[i].pre_attention(self.x[:t], pos, slots, self.model.rotary)
            self.q[:t].copy_(q)
            self.k[:t].copy_(k)
            self.v[:t].copy_(v)

    def _piece_fused(self, i: int, t: int) -> None:
        """The same with the fused layer's pieces: x and the residual stream travel between them; K/V go to
        the cache only (the attention reads them there)."""
        layers = self.model.layers
        ids, pos, slots = self.ints[0, :t], self.ints[1, :t], self.ints[2, :t]
        residual = None
        if i == 0:
            self.x[:t].copy_(self.model.embed_tokens(ids))
        else:
            x, residual = layers[i - 1].post_attention_fused(self.o[:t], self.residual[:t], self.skinny)
            self.x[:t].copy_(x)
            self.residual[:t].copy_(residual)
        if i < len(layers):
            q, residual = layers[i].pre_attention_fused(self.x[:t], residual, pos, slots, self.model.rotary,
                                                        self.skinny)
            self.q[:t].copy_(q)
            self.residual[:t].copy_(residual)

    def _capture(self) -> None:
        t0 = time.perf_counter()
        pool = None
        num_pieces = len(self.model.layers) + 1
        for t in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory pool
            graphs = []
            for i in range(num_pieces):  # slots all dummy: capture touches no live KV
                self._piece(i, t)  # warm-up outside capture (cuBLAS picks its kernels)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._piece(i, t)
                pool = graph.pool()
                graphs.append(graph)
            self.graphs[t] = graphs
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0

    @torch.inference_mode()
    def run(self, ids: torch.Tensor, pos: torch.Tensor, meta: AttnMeta, logits_indices: torch.Tensor,
            attn) -> torch.Tensor | None:
        """float32 logits [len(logits_indices), vocab] of one varlen step, as LlamaModel.forward computes
        them, or None when the step has more tokens than the largest bucket (the caller runs it eagerly)."""
        n = ids.shape[0]
        t = next((b for b in self.buckets if b >= n), None)
        if t is None:
            self.eager_fallbacks += 1
            return None
        if self.fused and meta.tiles is None:
            self.untiled_fallbacks += 1
            return None
        self.ints[0, :n].copy_(ids)
        self.ints[1, :n].copy_(pos)
        self.ints[2, :n].copy_(meta.slot_mapping)
        if t > n:
            self.ints[2, n:t].fill_(self.dummy_slot)  # an earlier, longer step left live slots there
        layers = self.model.layers
        kv = (None, None) if self.fused else (self.k[:n], self.v[:n])  # fused: attention reads K/V from the cache
        for i in range(len(layers) + 1):
            if self.capture:
                self.graphs[t][i].replay()
            else:
                self._piece(i, t)
            if i < len(layers):
                layer = layers[i]
                o = attn.prefill(self.q[:n], *kv, meta, layer.k_cache, layer.v_cache)
                self.o[:n].copy_(o.reshape(n, self.nh * self.hd))
        self.replays += 1
        return self.model.head(self.x[:n], self.residual[:n], logits_indices, self.fused, self.skinny)

    def evidence(self) -> dict:
        return {"on": True, "pieces": "fused" if self.fused else "plain", "buckets": self.buckets,
                "steps": self.replays, "eager_fallbacks": self.eager_fallbacks,
                "untiled_fallbacks": self.untiled_fallbacks, "graphs": sum(map(len, self.graphs.values())),
                "capture_s": round(self.capture_s, 3)}
