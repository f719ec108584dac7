"""CUDA graphs for decode steps (`cuda_graphs`; ModelRunner reads the switch once, where it builds this).

A decode step of n sequences replays the graph captured for the smallest batch-size bucket >= n
(1, 2, 4, 8, ... up to the engine's largest batch), from static input buffers: input_ids, positions,
slot_mapping and context_lens, and block tables padded to the widest table max_model_len needs. The
rows past n are padding: they write their K/V to a dummy slot (a block the KV pool keeps out of the
block manager) and attend to one token of it, so they touch no live sequence. A batch larger than the
largest bucket runs eagerly and is counted.

A replayed graph cannot read host values, so its decode attention cannot cut the cache at the batch's
longest context the way the eager naive and SDPA paths do (`meta.max_context_len`, a host int). Under
graphs decode attention is therefore always the Triton paged kernel (optladder/engine/kernels/paged_decode.py),
whatever flash_attn says: it reads context_lens on the device and serves the contiguous cache too, as
one block of max_model_len per sequence. Prefill stays eager and follows flash_attn.

The captured step is the step the engine would run eagerly: the eager layer, or the fused element-wise
kernels (optladder/engine/kernels/fused.py) with `fused_kernels`, and the skinny-GEMM kernel for buckets of up to 16
rows with `skinny_gemm` (optladder/engine/kernels/gemv.py; cuBLAS above). So a ladder measures graph replay alone and
each kernel alone. On the H200, Llama-3-8B's shape, batch 1, graph replay: eager layer 6.45 ms, fused
element-wise 4.54 ms, and skinny GEMM 4.40 ms; at batch 8 the skinny GEMM is even with cuBLAS
(benchmarks/results/gpu_h200.md). Steps with prompt tokens (prefill, chunked prefill's mixed steps) run
eagerly: their shapes change every step.
"""
from __future__ import annotations

import time

import torch

from optladder.engine.attention import AttnMeta
from optladder.engine.model import DecodeKernels, LlamaModel


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two below max_batch, and max_batch itself."""
    assert max_batch >= 1
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


class GraphDecodeAttention:
    """Decode attention that depends on no host value (see the module docstring). Decode only."""

    name = "triton_paged"

    def __init__(self) -> None:
        from optladder.engine.kernels.paged_decode import paged_decode_attention

        self.kernel = paged_decode_attention

    def decode(self, q, meta: AttnMeta, k_cache, v_cache) -> torch.Tensor:
        return self.kernel(q, k_cache, v_cache, meta.block_tables, meta.context_lens)

    def prefill(self, *args, **kwargs):
        raise AssertionError("graphs capture decode steps only")


class CUDAGraphRunner:
    def __init__(self, model: LlamaModel, device: torch.device, max_batch: int, max_model_len: int,
                 block_size: int, dummy_block: int, kernels: DecodeKernels = DecodeKernels()):
        assert device.type == "cuda", "cuda_graphs is refused on CPU at validation"
        self.model, self.device, self.kernels = model, device, kernels
        self.buckets = batch_buckets(max_batch)
        self.max_model_len = max_model_len
        self.dummy_slot = dummy_block * block_size
        width = -(-max_model_len // block_size)
        size = self.buckets[-1]
        # rows: input_ids, positions, slot_mapping, context_lens (one buffer: one host copy a step)
        self.ints = torch.zeros(4, size, dtype=torch.long, device=device)
        self.block_tables = torch.full((size, width), dummy_block, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(size, device=device)
        self.attn = GraphDecodeAttention()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0
        self.eager_fallbacks = 0
        self.capture_s = 0.0
        self._capture()

    def _args(self, bs: int):
        ids, pos, slots, ctx = self.ints[:, :bs]
        meta = AttnMeta(False, slots, self.block_tables[:bs], ctx, max_context_len=self.max_model_len)
        return ids, pos, meta, self.logits_indices[:bs]

    @property
    def _step_kw(self) -> dict:
        return dict(attn=self.attn, fused=self.kernels.fused, skinny=self.kernels.skinny)

    def _capture(self) -> None:
        t0 = time.perf_counter()
        self.fill(self.buckets[-1], [], [], [], [], None)  # every row padding: nothing live is touched
        pool = None
        for bs in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory pool
            args = self._args(bs)
            self.model(*args, **self._step_kw)  # warm-up: Triton compiles outside capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self.model(*args, **self._step_kw)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0

    def fill(self, bs: int, ids: list[int], pos: list[int], slots: list[int], ctx: list[int],
             tables: torch.Tensor | None) -> None:
        """Copy a step's inputs into bucket bs's buffers (the padding rows write to the dummy slot)."""
        pad = bs - len(ids)
        host = torch.tensor([ids + [0] * pad, pos + [0] * pad, slots + [self.dummy_slot] * pad,
                             ctx + [1] * pad], dtype=torch.long)
        self.ints[:, :bs].copy_(host)
        if tables is not None:
            self.block_tables[:tables.shape[0], :tables.shape[1]].copy_(tables)

    def bucket(self, n: int) -> int | None:
        """The captured batch that holds n rows, or None when n exceeds the largest (the caller then runs the
        step eagerly; counted here)."""
        bs = next((b for b in self.buckets if b >= n), None)
        if bs is None:
            self.eager_fallbacks += 1
        return bs

    def replay(self, bs: int, n: int) -> torch.Tensor:
        """Logits [n, vocab] of the step `fill` prepared for bucket bs."""
        self.graphs[bs].replay()
        self.replays += 1
        return self.outputs[bs][:n]

    def evidence(self) -> dict:
        return {"on": True, "buckets": self.buckets, "replays": self.replays,
                "eager_fallbacks": self.eager_fallbacks, "decode_attention": self.attn.name,
                "fused_kernels": self.kernels.fused, "skinny_gemm": self.kernels.skinny,
                "capture_s": round(self.capture_s, 3)}
