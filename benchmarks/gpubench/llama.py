"""Llama-3-8B's shape (random bf16 weights): prefill naive vs flash, the decode step eager vs CUDA graphs
(with and without the fused kernels and the skinny GEMM) against the floor of reading the weights and the KV
once, and one graph-replayed decode step against the eager one."""
from __future__ import annotations

import dataclasses
import random

import torch

from optladder.engine.attention import make_backend
from optladder.engine.block_manager import KVLayout
from optladder.engine.config import ModelConfig
from optladder.engine.kernels.reference import rel_error
from optladder.engine.loader import load_model
from optladder.engine.model import DecodeKernels
from optladder.engine.model_runner import ModelRunner, kv_bytes_per_token
from optladder.engine.scheduler import Batch
from optladder.engine.sequence import SamplingParams, Sequence
from gpubench.harness import BF16, DEV, TOL, gpu_median_ms, log, wall_median_ms

LLAMA8B = ModelConfig(name="llama3_8b_shape", source="random", package=None, gguf_file=None, tokenizer="synthetic",
                      vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                      max_position_embeddings=8192, tie_word_embeddings=False)


def weights_read_bytes(model) -> int:
    """What a decode step must read: every weight once, except the embedding table (B rows of it)."""
    emb = model.embed_tokens.weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not emb)


def make_runner(model, paged: bool, flash: bool, graphs: bool, seqs_n: int, max_len: int,
                fused: bool = True, skinny: bool = True, device: torch.device = DEV,
                dtype: torch.dtype = BF16) -> ModelRunner:
    """A runner with room for seqs_n sequences of max_len, built as the engine builds it from the switches
    paged_kv, flash_attn, cuda_graphs, fused_kernels (fused) and skinny_gemm (skinny)."""
    bs = 16 if paged else max_len
    s = model.shape
    runner = ModelRunner(model, device, dtype, KVLayout(bs, seqs_n * (max_len // bs)),
                         make_backend(flash, device, s.num_attention_heads, s.num_key_value_heads),
                         DecodeKernels(fused=fused, skinny=skinny), graph_max_batch=seqs_n if graphs else None,
                         max_model_len=max_len)
    gen = torch.Generator(device=device).manual_seed(7)
    for layer in model.layers:  # random KV, never zeros
        layer.k_cache.normal_(generator=gen)
        layer.v_cache.normal_(generator=gen)
    return runner


def decode_seqs(n: int, ctx: int, runner: ModelRunner, vocab: int) -> list[Sequence]:
    """n sequences of ctx tokens whose KV is in the cache but for the last token's: a decode step's input."""
    bs = runner.block_size
    blocks = list(range(runner.model.layers[0].k_cache.shape[0] - (1 if runner.graphs else 0)))
    random.Random(n).shuffle(blocks)  # a fragmented pool, as paged KV leaves it
    seqs = []
    for i in range(n):
        s = Sequence(f"d{i}", [random.randrange(3, vocab) for _ in range(ctx)], SamplingParams())
        s.block_table = [blocks.pop() for _ in range(-(-ctx // bs))]
        s.num_computed_tokens = ctx - 1
        seqs.append(s)
    return seqs


def decode_step(seqs: list[Sequence]) -> Batch:
    return Batch(seqs, [1] * len(seqs))


def prefill_step(seq: Sequence) -> Batch:
    """The whole prompt in one step, as without chunked prefill."""
    seq.num_computed_tokens = 0
    return Batch([seq], [len(seq)])


def prefill_bench(model) -> list[dict]:
    rows = []
    for flash in (False, True):
        # attention alone: no fused element-wise kernels, which the Triton varlen path would bring with it
        runner = make_runner(model, paged=False, flash=flash, graphs=False, seqs_n=1, max_len=4096, fused=False,
                             skinny=False)
        for t in (512, 2048, 4096):
            step = prefill_step(decode_seqs(1, t, runner, model.shape.vocab_size)[0])
            torch.cuda.synchronize()
            runner.forward(step)  # warm-up
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            ms = wall_median_ms(lambda: runner.forward(step), iters=5, warmup=1)  # noqa: F821 (run before the del below)
            peak = torch.cuda.max_memory_allocated() - base
            rows.append({"tokens": t, "attention": runner.attention_backend, "ms": ms, "peak_extra_gib": peak / 2**30,
                         "tok_s": t / ms * 1000})
            log(f"prefill {t:5d} {runner.attention_backend:>24s} {ms:8.1f} ms  peak +{peak / 2**30:.2f} GiB")
        del runner
        free_kv(model)
    return rows


def free_kv(model) -> None:
    for layer in model.layers:
        layer.k_cache = layer.v_cache = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def decode_bench(model, bw_tb_s: float, ctx: int = 1024, max_len: int = 2048) -> list[dict]:
    rows = []
    w_bytes = weights_read_bytes(model)
    kv_tok = kv_bytes_per_token(model, BF16)
    variants = [  # label, paged, graphs, fused, skinny
        ("paged, eager", True, False, False, False),
        ("paged, graphs, eager layer", True, True, False, False),
        ("paged, graphs + fused element-wise", True, True, True, False),
        ("paged, graphs + fused + skinny GEMM (engine)", True, True, True, True),
        ("contiguous, eager", False, False, False, False),
        ("contiguous, graphs + fused + skinny GEMM (engine)", False, True, True, True),
    ]
    for label, paged, graphs, fuse, skinny in variants:
        runner = make_runner(model, paged=paged, flash=True, graphs=graphs, seqs_n=64, max_len=max_len,
                             fused=fuse, skinny=skinny)
        for b in (1, 8, 32, 64):
            seqs = decode_seqs(b, ctx, runner, model.shape.vocab_size)
            step = decode_step(seqs)
            step_ms = wall_median_ms(lambda: runner.forward(step), iters=30)  # noqa: F821 (run before the del below)
            if runner.graphs:
                bucket = next(x for x in runner.graphs.buckets if x >= b)
                runner.forward(step)
                gpu_ms = gpu_median_ms(runner.graphs.graphs[bucket].replay, iters=30)
            else:
                prep = runner.prepare_decode(seqs)
                gpu_ms = gpu_median_ms(lambda: model(*prep), iters=30)
            floor_ms = (w_bytes + b * ctx * kv_tok) / (bw_tb_s * 1e12) * 1000
            rows.append({"variant": label, "batch": b, "context": ctx, "step_ms": step_ms, "gpu_ms": gpu_ms,
                         "floor_ms": floor_ms, "step_over_floor": step_ms / floor_ms,
                         "gpu_over_floor": gpu_ms / floor_ms, "tok_s": b / step_ms * 1000,
                         "attention": runner.attention_backend})
            log(f"decode {label:50s} B={b:3d} step {step_ms:7.2f} ms gpu {gpu_ms:7.2f} ms floor {floor_ms:6.2f} ms")
        del runner
        free_kv(model)
    return rows


def decode_step_equivalence(model) -> list[dict]:
    """One decode step of 5 sequences (3 padding rows in the bucket of 8), graph-replayed with and without
    the fused kernels, against the eager step with the same attention kernel. On the 32-layer random model
    bf16 rounding differences (GEMM shapes, kernels) grow to ~5% of the logits whatever their source (the
    eager naive vs eager Triton row shows the scale), so the pass/fail check runs 2 layers of the same
    widths and the 32-layer rows are information: argmax agreement."""
    rows = []
    small = load_model(dataclasses.replace(LLAMA8B, num_hidden_layers=2), DEV, BF16, seed=1)
    for m, layers, info in ((small, 2, False), (model, 32, True)):
        for paged in (True, False):
            for fuse in (False, True):
                runner = make_runner(m, paged=paged, flash=False, graphs=True, seqs_n=8, max_len=2048, fused=fuse,
                                     skinny=fuse)
                seqs = decode_seqs(5, 700, runner, m.shape.vocab_size)
                prep = runner.prepare_decode(seqs)
                eager = m(*prep, attn=runner.graphs.attn).double()
                got = runner.forward(decode_step(seqs)).clone()
                layout = "paged" if paged else "contiguous"
                err = rel_error(got, eager)
                rows.append({"check": f"decode step logits, {layers} layers, {layout}, graphs"
                                      f"{' + fused + skinny' if fuse else ''} vs eager (same attention kernel)",
                             "rel_err": err, "ok": info or err <= TOL, "info_only": info,
                             "argmax_agree": (got.argmax(-1) == eager.argmax(-1)).float().mean().item()})
                if fuse:
                    naive = m(*prep).double()
                    rows.append({"check": f"decode step logits, {layers} layers, {layout}, eager naive vs eager "
                                          "Triton attention (the rounding scale)", "rel_err": rel_error(naive, eager),
                                 "ok": True, "info_only": True,
                                 "argmax_agree": (naive.argmax(-1) == eager.argmax(-1)).float().mean().item()})
                del runner
                free_kv(m)
    del small
    torch.cuda.empty_cache()
    return rows
