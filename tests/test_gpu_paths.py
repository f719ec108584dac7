"""The GPU opts from a CPU: validation refuses what cannot run; the Triton kernels (paged decode attention,
the fused decode-step kernels, the skinny GEMM) run under Triton's interpreter on CPU tensors against
float64 or eager references; the fused decode step of a whole model matches the eager one. Tests that need CUDA (bf16
kernels, graph capture and replay) skip without it; benchmarks/gpu_bench.py runs the full checks there.
"""
from __future__ import annotations

import os

import pytest
import torch

from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.validation import validate_engine, validate_head_dim

CUDA = torch.cuda.is_available()
if not CUDA:  # before the first import of a kernel module: Triton picks the interpreter at decoration
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = torch.device("cuda" if CUDA else "cpu")
needs_triton = pytest.mark.skipif(
    not CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="no CUDA and no Triton interpreter")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def triton_or_skip():
    pytest.importorskip("triton", reason="Triton is not installed (pip install triton for the interpreter)")


# --- validation: refused before anything loads, with the reason and the fix ---

def test_cuda_graphs_refused_on_cpu():
    with pytest.raises(ValueError, match=r"cuda_graphs runs on CUDA only.*drop \+opt=cuda_graphs"):
        validate_engine(EngineConfig(cuda_graphs=True), "cpu")
    validate_engine(EngineConfig(cuda_graphs=True), "cuda")


def test_flash_attn_float32_refused_on_cuda():
    with pytest.raises(ValueError, match="flash kernel has no float32.*engine.dtype=bfloat16"):
        validate_engine(EngineConfig(flash_attn=True, dtype="float32"), "cuda")
    validate_engine(EngineConfig(flash_attn=True, dtype="float32"), "cpu")  # fused SDPA on CPU takes it
    validate_engine(EngineConfig(flash_attn=True, dtype="bfloat16"), "cuda")


@pytest.mark.parametrize("opt", ["flash_attn", "cuda_graphs"])
@pytest.mark.parametrize("head_dim", [100, 12, 320])
def test_unsupported_head_dim_refused(opt: str, head_dim: int):
    cfg = EngineConfig(**{opt: True})
    with pytest.raises(ValueError, match=rf"opt {opt}: head_dim {head_dim} is not supported.*drop \+opt={opt}"):
        validate_head_dim(cfg, "cuda", head_dim)
    validate_head_dim(cfg, "cpu", head_dim)  # the CPU paths take any head dim
    for ok in (64, 128, 256, 80):
        validate_head_dim(cfg, "cuda", ok)
    validate_head_dim(EngineConfig(), "cuda", head_dim)  # with the opt off nothing is refused


def test_batch_buckets():
    from optladder.engine.cuda_graphs import batch_buckets

    assert batch_buckets(1) == [1]
    assert batch_buckets(16) == [1, 2, 4, 8, 16]
    assert batch_buckets(24) == [1, 2, 4, 8, 16, 24]


# --- the paged decode kernel against float64 ---

def random_paged(batch, heads, kv_heads, head_dim, block_size, max_len, dtype, gen, empty_row=False):
    per_seq = -(-max_len // block_size)
    num_blocks = batch * per_seq + 2
    q = torch.randn(batch, heads, head_dim, generator=gen).to(dtype)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    tables = torch.randperm(num_blocks, generator=gen)[:batch * per_seq].view(batch, per_seq).int()
    ctx = torch.randint(1, max_len + 1, (batch,), generator=gen).int()
    ctx[0] = max_len
    if empty_row:
        ctx[-1] = 0
    return [t.to(DEVICE) for t in (q, k_cache, v_cache, tables, ctx)]


CASES = [  # batch, heads, kv_heads, head_dim, block_size, max_len, splits
    (3, 4, 2, 16, 16, 70, None),
    (3, 4, 2, 16, 16, 70, 3),  # split-K with a split past the end of the shorter contexts
    (2, 9, 3, 64, 8, 100, 4),  # SmolLM2's group of 3, padded to 16 rows
    (2, 8, 2, 40, 128, 128, 1),  # a head dim that is no power of two; one block per sequence
    (2, 4, 4, 32, 64, 64, 2),  # contiguous layout: one block of max_model_len, tables [B, 1]
]


@needs_triton
@pytest.mark.parametrize("case", CASES)
def test_paged_decode_matches_float64(case):
    triton_or_skip()
    from optladder.engine.kernels.paged_decode import paged_decode_attention
    from optladder.engine.kernels.reference import paged_decode_reference, rel_error

    b, h, kvh, d, bs, max_len, splits = case
    gen = torch.Generator().manual_seed(hash(case) % 2**31)
    dtype = torch.bfloat16 if CUDA else torch.float32  # the interpreter's bf16 rounding is not the GPU's
    for _ in range(2 if CUDA else 1):  # fresh inputs each check; the interpreter is slow
        q, kc, vc, bt, ctx = random_paged(b, h, kvh, d, bs, max_len, dtype, gen, empty_row=True)
        out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
        paged_decode_attention(q, kc, vc, bt, ctx, out=out, splits=splits)
        ref = paged_decode_reference(q, kc, vc, bt, ctx)
        assert rel_error(out, ref) <= (1e-2 if CUDA else 1e-5)
        assert out[-1].abs().max() == 0  # an empty context gives zeros, not NaN (graph padding rows)


@needs_triton
def test_ranges_past_the_context_write_no_partial_and_the_merge_reads_none(monkeypatch):
    """12 splits of a wide table over short contexts (most ranges empty): the split kernel writes no partial for
    an empty range, so the merge must not read one. The partials' buffer is poisoned (NaN): a merge that read an
    unwritten partial would give NaN (its weight 0 times NaN)."""
    triton_or_skip()
    from optladder.engine.kernels import paged_decode as pd
    from optladder.engine.kernels.reference import paged_decode_reference, rel_error

    gen = torch.Generator().manual_seed(12)
    dtype = torch.bfloat16 if CUDA else torch.float32
    q, kc, vc, bt, ctx = random_paged(3, 4, 2, 16, 16, 256, dtype, gen, empty_row=True)
    ctx[0], ctx[1] = 40, 7  # ranges of 64 tokens: 1 of 12 live, the rest past the context
    real_empty = torch.empty
    monkeypatch.setattr(pd.torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    out = pd.paged_decode_attention(q, kc, vc, bt, ctx, splits=12)
    assert not torch.isnan(out).any()
    assert rel_error(out, paged_decode_reference(q, kc, vc, bt, ctx)) <= (1e-2 if CUDA else 1e-5)
    assert out[-1].abs().max() == 0


@needs_triton
def test_split_heuristic_depends_on_shapes_only():
    triton_or_skip()
    from optladder.engine.kernels.paged_decode import grid_splits, num_splits

    # the larger of two waves' worth (decides batches of 1 and 2) and ~96 programs a multiprocessor (at most 12),
    # at most 32, from the batch rounded up to a power of two (the graph bucket it replays in)
    assert num_splits(1, 8, 132) == 32 and num_splits(2, 8, 132) == 17  # two waves, as before
    assert num_splits(8, 8, 132) == 12 and num_splits(16, 8, 132) == 12
    assert num_splits(64, 8, 132) == 12  # 512 programs: capped at 12 splits
    assert num_splits(256, 8, 132) == 7  # 2,048 programs: 12,672 / 2,048 -> 7
    assert num_splits(2048, 8, 132) == 1  # the batch alone gives each multiprocessor its programs
    for n, bucket in [(3, 4), (5, 8), (17, 32), (129, 256), (192, 256)]:  # a batch splits as its bucket does
        assert num_splits(n, 3, 132) == num_splits(bucket, 3, 132), n
    assert num_splits(3, 3, 132) != num_splits(2, 3, 132)  # ... and the bucket below may not
    # the table's width trims the grid to the ranges it can hold (whole tiles), never the ranges themselves
    assert grid_splits(32, 8192, 64) == 32 and grid_splits(32, 256, 64) == 4 and grid_splits(32, 64, 64) == 1
    assert grid_splits(12, 100, 32) == 4 and grid_splits(1, 8192, 64) == 1


GRAPH_CASES = [  # heads, kv heads, head dim, block size, eager batch, graph bucket, longest context
    (9, 3, 64, 16, 3, 4, 300),  # SmolLM2's attention
    (8, 2, 128, 16, 5, 8, 300),
    (4, 2, 256, 8, 2, 2, 300),  # tiles of 32 tokens; no padding row: only the table's width differs
    (8, 2, 128, 16, 5, 6, 300),  # the largest bucket, max_batch 6, no power of two
    (9, 3, 64, 16, 3, 4, 60),  # one tile: one program eagerly, a merge of one live range in the graph
]


@needs_triton
@pytest.mark.parametrize("case", GRAPH_CASES, ids=["smollm2", "bucket8", "d256", "max_batch6", "one_tile"])
def test_a_graph_bucket_gives_each_row_the_eager_bits(case):
    """A decode step replayed in a graph runs the batch's bucket (padding rows attend to one dummy token) with
    tables as wide as max_model_len; the eager step runs the batch with tables as wide as its longest context.
    Every live row must come out bit for bit the same, or a cuda_graphs rung rewrites answers its eager control
    gives (exact match 81.5% on the H200 when the table's width set the split count)."""
    triton_or_skip()
    from optladder.engine.kernels.paged_decode import paged_decode_attention

    heads, kvh, d, bs, n, bucket, longest = case
    gen = torch.Generator().manual_seed(n * 1000 + d + longest)
    dtype = torch.bfloat16 if CUDA else torch.float32
    q, kc, vc, bt, ctx = random_paged(n, heads, kvh, d, bs, longest, dtype, gen)
    ctx[-1] = min(90, longest)  # several ranges of a tile or more (one tile at most for longest 60)
    eager_w = -(-int(ctx.max()) // bs)
    eager = paged_decode_attention(q, kc, vc, bt[:, :eager_w].contiguous(), ctx)
    wide = 4096 // bs  # max_model_len 4,096: a graph's table
    dummy = sorted(set(range(kc.shape[0])) - set(bt.flatten().tolist()))[0]  # a block no live row uses
    bt_g = torch.full((bucket, wide), dummy, dtype=bt.dtype, device=bt.device)
    bt_g[:n, :bt.shape[1]] = bt
    ctx_g = torch.ones(bucket, dtype=ctx.dtype, device=ctx.device)
    ctx_g[:n] = ctx
    q_g = torch.zeros(bucket, *q.shape[1:], dtype=q.dtype, device=q.device)
    q_g[:n] = q
    graph = paged_decode_attention(q_g, kc, vc, bt_g, ctx_g)
    assert torch.equal(graph[:n], eager)


# --- the varlen kernel of mixed steps (chunked prefill) against float64 ---

VARLEN_CASES = [  # heads, kv heads, head dim, block size, (query len, context len) per sequence
    (6, 2, 32, 4, [(5, 5), (1, 9), (17, 30), (1, 1), (3, 40)]),  # fresh, decode rows, chunks after a cache
    (8, 8, 64, 16, [(40, 100), (1, 100)]),  # no GQA, a chunk spanning tiles
    (9, 3, 64, 16, [(33, 33), (2, 70)]),  # SmolLM2's group of 3, padded to 4
]


@needs_triton
@pytest.mark.parametrize("case", VARLEN_CASES, ids=["mixed", "mha", "group3"])
def test_paged_prefill_matches_float64(case):
    triton_or_skip()
    from optladder.engine.kernels.paged_prefill import block_q, paged_prefill_attention, tile_list
    from optladder.engine.kernels.reference import paged_prefill_reference, rel_error

    h, kvh, d, bs, rows = case
    q_lens, ctx = [r[0] for r in rows], [r[1] for r in rows]
    gen = torch.Generator().manual_seed(len(rows) * 1000 + d)
    dtype = torch.bfloat16 if CUDA else torch.float32
    for _ in range(2 if CUDA else 1):  # fresh inputs each check
        per_seq = [-(-c // bs) for c in ctx]
        num_blocks = sum(per_seq) + 2
        kc = torch.randn(num_blocks, bs, kvh, d, generator=gen).to(dtype).to(DEVICE)
        vc = torch.randn(num_blocks, bs, kvh, d, generator=gen).to(dtype).to(DEVICE)
        perm = torch.randperm(num_blocks, generator=gen).tolist()  # tables that are no identity map
        tables, used = torch.zeros(len(rows), max(per_seq), dtype=torch.int32), 0
        for i, n in enumerate(per_seq):
            tables[i, :n] = torch.tensor(perm[used:used + n])
            used += n
        q = torch.randn(sum(q_lens), h, d, generator=gen).to(dtype).to(DEVICE)
        starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
        tiles = torch.tensor(tile_list(q_lens, block_q(h, kvh)), dtype=torch.int32, device=DEVICE)
        out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
        paged_prefill_attention(q, kc, vc, tables.to(DEVICE), starts, torch.tensor(ctx, device=DEVICE), tiles,
                                out=out)
        ref = paged_prefill_reference(q, kc, vc, tables.to(DEVICE), q_lens, ctx)
        assert rel_error(out, ref) <= (1e-2 if CUDA else 1e-5)


def test_tile_list_covers_every_query_once():
    from optladder.engine.kernels.paged_prefill import tile_list

    seq, first = tile_list([5, 1, 33, 0, 16], 16)
    assert list(zip(seq, first)) == [(0, 0), (1, 0), (2, 0), (2, 16), (2, 32), (4, 0)]


@needs_triton
@pytest.mark.skipif(CUDA, reason="the CPU path through Triton's interpreter; on a GPU the replay runs the kernels")
def test_chunked_prefill_through_the_triton_kernels_keeps_greedy_tokens():
    """The whole engine path of a chunked step (slots, tiles, the varlen and decode kernels) on a tiny
    model: every prompt split, decodes mixed in, the same tokens as naive attention without chunks."""
    triton_or_skip()
    from optladder.engine.attention import FusedAttention
    from optladder.engine.llm_engine import LLMEngine
    from optladder.engine.sequence import SamplingParams
    from tests.test_engine_equivalence import BASE, model_config

    prompts = [[(7 * i + j) % 500 + 3 for j in range(20 + 9 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    base = LLMEngine(model_config("tiny"), EngineConfig(**BASE))
    want = [s.output_token_ids for s in base.generate(prompts, params)]
    engine = LLMEngine(model_config("tiny"), EngineConfig(**{**BASE, "paged_kv": True, "dynamic_batching": True,
                                                             "chunked_prefill": True, "flash_attn": True,
                                                             "max_num_batched_tokens": 16}))
    shape = engine.model.shape
    engine.model.attn = FusedAttention(engine.device, shape.num_attention_heads, shape.num_key_value_heads,
                                       triton=True)
    got = [s.output_token_ids for s in engine.generate(prompts, params)]
    assert got == want
    eff = engine.opts_effective()
    assert eff["chunked_prefill"]["prompts_split"] == 3 and eff["chunked_prefill"]["mixed_steps"] > 0
    assert eff["flash_attn"]["varlen_kernel_steps"] > 0


# --- the fused element-wise kernels against the eager modules ---

@needs_triton
def test_fused_kernels_match_eager_modules():
    triton_or_skip()
    from optladder.engine.kernels import fused
    from optladder.engine.model import RMSNorm, Rotary

    dtype = torch.bfloat16 if CUDA else torch.float32
    gen = torch.Generator().manual_seed(1)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dtype).to(DEVICE)  # noqa: E731
    x, r = rnd(5, 96), rnd(5, 96)
    norm = RMSNorm(96, 1e-5).to(DEVICE, dtype)
    norm.weight.data = rnd(96)
    y, r_out = fused.add_rmsnorm(x, r, norm.weight, 1e-5)
    assert torch.equal(r_out, x + r)
    torch.testing.assert_close(y, norm(x + r))
    y, r_out = fused.add_rmsnorm(x, None, norm.weight, 1e-5)
    assert torch.equal(r_out, x)
    torch.testing.assert_close(y, norm(x))

    gu = rnd(5, 80)
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(fused.silu_mul(gu), torch.nn.functional.silu(gate) * up)

    nh, nkv, hd = 6, 2, 32
    rot = Rotary(hd, 64, 10000.0).to(DEVICE)
    qkv = rnd(3, (nh + 2 * nkv) * hd)
    pos = torch.tensor([5, 0, 63], device=DEVICE)
    slots = torch.tensor([7, 2, 11], device=DEVICE)
    kc = torch.zeros(4, 4, nkv, hd, dtype=dtype, device=DEVICE)
    vc = torch.zeros_like(kc)
    q = fused.rope_store_kv(qkv, pos, rot.cos, rot.sin, slots, kc, vc, nh, nkv, hd)
    qr, kr, vr = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    q_ref, k_ref = rot(pos, qr.view(3, nh, hd), kr.view(3, nkv, hd))
    assert torch.equal(q, q_ref)
    assert torch.equal(kc.view(-1, nkv, hd)[slots], k_ref)
    assert torch.equal(vc.view(-1, nkv, hd)[slots], vr.view(3, nkv, hd))


@needs_triton
@pytest.mark.parametrize("silu", [False, True])
def test_skinny_gemm_matches_float64(silu: bool):
    triton_or_skip()
    from optladder.engine.kernels.gemv import skinny_linear
    from optladder.engine.kernels.reference import rel_error

    dtype = torch.bfloat16 if CUDA else torch.float32
    gen = torch.Generator().manual_seed(2)
    for m, n, k in ((1, 96, 64), (5, 100, 80), (16, 64, 576)):
        x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
        w = torch.randn(n, k, generator=gen).to(dtype).to(DEVICE)
        ref = x.double() @ w.double().T
        if silu:
            gate, up = ref.chunk(2, dim=-1)
            ref = torch.nn.functional.silu(gate) * up
        got = skinny_linear(x, w, silu_mul=silu, config=(16, 64, 4, 2))
        assert rel_error(got, ref) <= (1e-2 if CUDA else 1e-5)


# --- a whole model: the fused decode step, attention through the kernel, equals the eager step ---

def tiny_model(dtype):
    from optladder.engine.config import ModelConfig
    from optladder.engine.loader import load_model

    cfg = ModelConfig(name="tiny", source="random", package=None, gguf_file=None, tokenizer="synthetic",
                      vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                      max_position_embeddings=256, tie_word_embeddings=True, init_std=0.1)
    return load_model(cfg, DEVICE, dtype, seed=3)


class KernelDecode:
    """Naive prefill, decode through the Triton kernel: on CUDA in float32 too (flash has no float32)."""

    name, decode_backend = "naive", "triton_paged"

    def __init__(self):
        from optladder.engine.attention import NaiveAttention
        from optladder.engine.kernels.paged_decode import paged_decode_attention

        self.prefill, self.kernel = NaiveAttention().prefill, paged_decode_attention

    def decode(self, q, meta, k_cache, v_cache):
        return self.kernel(q, k_cache, v_cache, meta.block_tables, meta.context_lens)


def run_decode(model, prompts, steps, paged: bool, flash: bool, graphs: bool = False, max_batch: int = 8,
               decode_kernel: bool = False, kernels=None, attn=None):
    """Greedy decode through ModelRunner with a hand-made block table; returns the token ids.
    decode_kernel: decode attention through the Triton kernel on any device (on CUDA, flash_attn with
    paged_kv picks it on its own)."""
    from optladder.engine.attention import make_backend
    from optladder.engine.block_manager import KVLayout
    from optladder.engine.model import DecodeKernels
    from optladder.engine.model_runner import ModelRunner
    from optladder.engine.scheduler import Batch
    from optladder.engine.sequence import SamplingParams, Sequence

    max_len, block_size = 64, (8 if paged else 64)
    per_seq = max_len // block_size
    s = model.shape
    runner = ModelRunner(model, DEVICE, model.embed_tokens.weight.dtype,
                         KVLayout(block_size, len(prompts) * per_seq),
                         make_backend(flash, DEVICE, s.num_attention_heads, s.num_key_value_heads),
                         kernels or DecodeKernels(), graph_max_batch=max_batch if graphs else None,
                         max_model_len=max_len)
    if decode_kernel:
        model.attn = KernelDecode()
    if attn is not None:
        model.attn = attn
    seqs = [Sequence(f"r{i}", p, SamplingParams(max_tokens=steps)) for i, p in enumerate(prompts)]
    for i, seq in enumerate(seqs):  # reversed block order: tables that are no identity map
        seq.block_table = [(len(prompts) - 1 - i) * per_seq + j for j in range(per_seq)]
    batch = Batch(seqs, [len(seq) for seq in seqs])
    for _ in range(steps + 1):
        out = runner.sample(runner.forward(batch), seqs).tolist()
        for seq, t in zip(seqs, out):
            seq.num_computed_tokens = len(seq)
            seq.append_token(t)
        batch = Batch(seqs, [1] * len(seqs))
    return [seq.output_token_ids for seq in seqs], runner


PROMPTS = [[1, 5, 9, 200, 33], [7, 7, 7], [3, 100, 4, 99, 5, 98, 6, 97, 8, 96, 10]]


@needs_triton
def test_fused_decode_step_matches_eager_logits():
    triton_or_skip()
    from optladder.engine.attention import AttnMeta
    from optladder.engine.cuda_graphs import GraphDecodeAttention
    from optladder.engine.sequence import SamplingParams, Sequence

    model = tiny_model(torch.float32)
    _, runner = run_decode(model, PROMPTS, 2, paged=True, flash=False)
    seqs = [Sequence("a", PROMPTS[0] + [1, 2], SamplingParams()), Sequence("b", PROMPTS[2] + [3], SamplingParams())]
    seqs[0].block_table, seqs[1].block_table = [16, 17, 18, 19, 20, 21, 22, 23], [0, 1, 2, 3, 4, 5, 6, 7]
    for seq in seqs:
        seq.num_computed_tokens = len(seq) - 1
    ids, pos, meta, idx = runner.prepare_decode(seqs)
    eager = model(ids, pos, meta, idx)
    meta2 = AttnMeta(False, meta.slot_mapping, meta.block_tables, meta.context_lens, 10**9)
    for skinny in (False, True):  # on the CPU skinny falls back to torch's linear: the dispatch is tested
        fused = model(ids, pos, meta2, idx, attn=GraphDecodeAttention(), fused=True, skinny=skinny)
        torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-4)


@needs_triton
@pytest.mark.parametrize("paged", [False, True])
def test_decode_through_the_kernel_keeps_greedy_tokens(paged: bool):
    triton_or_skip()
    model = tiny_model(torch.float32)
    base, _ = run_decode(model, PROMPTS, 10, paged=paged, flash=False)  # contexts cross block boundaries
    got, runner = run_decode(model, PROMPTS, 10, paged=paged, flash=False, decode_kernel=True)
    assert runner.attention_backend.endswith("+triton_paged")
    assert got == base


@needs_cuda
@pytest.mark.parametrize("paged", [False, True])
def test_cuda_graphs_replay_the_eager_tokens(paged: bool):
    # float32 and the same attention kernel eagerly: any difference is the graph's, not rounding's
    model = tiny_model(torch.float32)
    base, _ = run_decode(model, PROMPTS, 12, paged=paged, flash=False, decode_kernel=True)
    got, runner = run_decode(model, PROMPTS, 12, paged=paged, flash=False, graphs=True)
    assert got == base
    ev = runner.graphs.evidence()
    assert ev["replays"] == 12 and ev["eager_fallbacks"] == 0 and ev["buckets"] == [1, 2, 4, 8]


@needs_cuda
def test_batch_above_the_largest_bucket_runs_eagerly_and_is_counted():
    model = tiny_model(torch.float32)
    base, _ = run_decode(model, PROMPTS, 4, paged=True, flash=False)
    got, runner = run_decode(model, PROMPTS, 4, paged=True, flash=False, graphs=True, max_batch=2)
    assert got == base
    assert runner.graphs.eager_fallbacks == 4 and runner.graphs.replays == 0


@needs_cuda
def test_teacher_forced_scores_compared_on_the_gpu_equal_the_host_comparison():
    # the reference engine on CUDA leaves its log-probs on the device and they are compared there
    import numpy as np

    from optladder.backends.engines import ReferenceBackend
    from optladder.quality.teacher_forced import compare

    cfg = EngineConfig(device="cuda", max_model_len=256, kv_cache_gb=0.05, paged_kv=True)
    model = ModelConfig(name="tiny", source="random", tokenizer="synthetic", vocab_size=49152, hidden_size=64,
                        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, init_std=0.3)
    a, b = ReferenceBackend(model, cfg), ReferenceBackend(model, EngineConfig(**{**cfg.__dict__, "flash_attn": True}))
    ids = [list(range(5, 45)), list(range(100, 130))]
    pa, pb = a.score(ids, [10, 5]), b.score(ids, [10, 5])
    assert pa[0].full.device.type == "cuda"
    for x, y in zip(pa, pb):
        dev = compare(x, y)[0]
        host = compare(x.on_host(), y.on_host())[0]
        np.testing.assert_allclose(dev.kl, host.kl, rtol=1e-4, atol=1e-9)
        np.testing.assert_array_equal(dev.top1_agree, host.top1_agree)
