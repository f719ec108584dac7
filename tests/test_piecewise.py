"""piecewise_graphs (optladder/engine/piecewise.py): steps with prompt tokens through the layer's pieces around an eager
attention, padded to a token bucket. On the CPU the pieces run without capture, so what is checked here is the
cutting, the padding and the static buffers: the same logits and tokens as the eager forward, the same KV in
every live block (padding rows write only the dummy slot, even after a longer step left live slots in the
buffer), and the fallback past the largest bucket. On CUDA the same checks run with the pieces captured."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from optladder.engine.piecewise import PiecewiseGraphRunner, token_buckets
from tests.test_gpu_paths import CUDA, DEVICE, tiny_model

BLOCK = 8
PER_SEQ = 8  # blocks a sequence may use: 64 positions
NUM_SEQS = 4


def make_runner(model, flash: bool = False, fused: bool = False):
    """flash: on CUDA the Triton varlen kernel (what the engine runs there; it takes float32 too), on the CPU
    SDPA; else naive attention. fused: the fused layer (fused_kernels), with the Triton varlen kernel (on the
    CPU through Triton's interpreter), the only attention it runs varlen steps with."""
    from optladder.engine.attention import FusedAttention, NaiveAttention
    from optladder.engine.block_manager import KVLayout
    from optladder.engine.model import DecodeKernels
    from optladder.engine.model_runner import ModelRunner

    s = model.shape
    attn = FusedAttention(DEVICE, s.num_attention_heads, s.num_key_value_heads, triton=CUDA or fused) \
        if flash or fused else NaiveAttention()
    # one block more than the sequences use: the dummy block padding rows write to (graphs keep one too)
    return ModelRunner(model, DEVICE, model.embed_tokens.weight.dtype, KVLayout(BLOCK, NUM_SEQS * PER_SEQ + 1),
                       attn, DecodeKernels(fused=fused), max_model_len=64)


def script(runner, plan):
    """Varlen steps through runner.forward: plan is a list of steps, each {seq index: tokens to compute}; a
    sequence whose prompt is all computed gets its greedy token appended. Returns the logits of each step and
    the tokens of each sequence."""
    from optladder.engine.scheduler import Batch
    from optladder.engine.sequence import SamplingParams, Sequence

    g = torch.Generator().manual_seed(5)
    lengths = [37, 9, 21, 3]
    seqs = [Sequence(f"r{i}", torch.randint(1, 500, (n,), generator=g).tolist(), SamplingParams(max_tokens=16))
            for i, n in enumerate(lengths)]
    for i, seq in enumerate(seqs):  # reversed block order: tables that are no identity map
        seq.block_table = [(NUM_SEQS - 1 - i) * PER_SEQ + j for j in range(PER_SEQ)]
    logits_out = []
    for step in plan:
        chosen = [seqs[i] for i in step]
        batch = Batch(chosen, [step[i] for i in step])
        logits = runner.forward(batch)
        logits_out.append(logits.float().cpu())
        toks = runner.sample(logits, batch.sampled_seqs).tolist()
        for seq, n in zip(chosen, batch.num_new_tokens):
            seq.num_computed_tokens += n
        for seq, t in zip(batch.sampled_seqs, toks):
            seq.append_token(t)
    return logits_out, [s.output_token_ids for s in seqs]


# whole prompts (12 tokens), then a chunk of the long one beside another prompt (41), then a shorter mixed step
# (19, padded to 32) after it: its padding rows 19-31 hold the 41-token step's live slots in the shared buffer and
# must write the dummy slot instead; then decodes of all
PLAN = [{1: 9, 3: 3}, {0: 20, 2: 21}, {0: 17, 1: 1, 3: 1}, {2: 1, 1: 1, 3: 1}, {0: 1, 1: 1, 2: 1, 3: 1}]


def live_kv(runner):
    return [(layer.k_cache[:NUM_SEQS * PER_SEQ].float().cpu(), layer.v_cache[:NUM_SEQS * PER_SEQ].float().cpu())
            for layer in runner.model.layers]


def test_token_buckets():
    assert token_buckets(100) == [16, 32, 64, 100] and token_buckets(64) == [16, 32, 64] and token_buckets(5) == [5]
    b = token_buckets(8192)
    assert b[:8] == [16, 32, 64, 128, 160, 192, 224, 256] and b[-5:] == [4096, 5120, 6144, 7168, 8192]
    assert all(hi <= lo * 1.25 for lo, hi in zip(b[3:], b[4:]))  # past 128, padding costs at most a quarter


@pytest.mark.parametrize("flash,fused", [(False, False), (True, False), (True, True)],
                         ids=["naive", "flash", "fused"])
def test_pieces_give_the_eager_logits_tokens_and_kv(flash, fused):
    if fused:
        pytest.importorskip("triton")
    dtype = torch.float32  # the pieces pad to a bucket: GEMMs of another shape, the same values to fp order
    model = tiny_model(dtype)
    eager = make_runner(model, flash, fused)
    want_logits, want_tokens = script(eager, PLAN)
    want_kv = live_kv(eager)

    model = tiny_model(dtype)
    runner = make_runner(model, flash, fused)
    runner.piecewise = PiecewiseGraphRunner(model, DEVICE, 64, dummy_slot=NUM_SEQS * PER_SEQ * BLOCK,
                                            kernels=runner.kernels, capture=CUDA)
    got_logits, got_tokens = script(runner, PLAN)
    assert got_tokens == want_tokens
    tol = 1e-4 if CUDA else 1e-5
    for got, want in zip(got_logits, want_logits):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    for (gk, gv), (wk, wv) in zip(live_kv(runner), want_kv):
        torch.testing.assert_close(gk, wk, atol=tol, rtol=tol)
        torch.testing.assert_close(gv, wv, atol=tol, rtol=tol)
    pw = runner.piecewise.evidence()
    assert pw["steps"] == 3 and pw["eager_fallbacks"] == pw["untiled_fallbacks"] == 0  # the three prompt steps
    assert pw["pieces"] == ("fused" if fused else "plain")
    assert pw["graphs"] == (len(token_buckets(64)) * (len(model.layers) + 1) if CUDA else 0)


def test_a_step_past_the_largest_bucket_runs_eagerly_and_is_counted():
    model = tiny_model(torch.float32)
    eager = make_runner(model)
    want_logits, want_tokens = script(eager, PLAN)

    model = tiny_model(torch.float32)
    runner = make_runner(model)
    runner.piecewise = PiecewiseGraphRunner(model, DEVICE, 20, dummy_slot=NUM_SEQS * PER_SEQ * BLOCK, capture=CUDA)
    got_logits, got_tokens = script(runner, PLAN)
    assert got_tokens == want_tokens
    # steps of 12, 41 and 19 tokens against buckets [16, 20]: the 41-token step ran eagerly
    assert runner.piecewise.evidence()["steps"] == 2 and runner.piecewise.evidence()["eager_fallbacks"] == 1


def test_fused_pieces_leave_a_step_without_the_varlen_kernel_to_the_eager_path():
    pytest.importorskip("triton")
    model = tiny_model(torch.float32)
    runner = make_runner(model, fused=True)
    runner.piecewise = PiecewiseGraphRunner(model, DEVICE, 64, dummy_slot=NUM_SEQS * PER_SEQ * BLOCK,
                                            kernels=runner.kernels, capture=CUDA)
    ids, pos = torch.tensor([1, 2, 3], device=DEVICE), torch.tensor([0, 1, 2], device=DEVICE)
    from optladder.engine.attention import AttnMeta

    meta = AttnMeta(True, torch.tensor([0, 1, 2], device=DEVICE), torch.zeros(1, 1, dtype=torch.int32, device=DEVICE),
                    torch.tensor([3], device=DEVICE), 3, [3], [3])  # no tiles: SDPA would need k and v
    assert runner.piecewise.run(ids, pos, meta, torch.tensor([2], device=DEVICE), model.attn) is None
    assert runner.piecewise.evidence()["untiled_fallbacks"] == 1


def test_piecewise_graphs_is_refused_without_cuda_graphs_with_lossy_formats_and_on_a_cpu():
    from optladder.engine.config import EngineConfig
    from optladder.engine.validation import validate_engine

    with pytest.raises(ValueError, match="piecewise_graphs needs cuda_graphs"):
        validate_engine(EngineConfig(piecewise_graphs=True), "cuda")
    for lossy in ("kv_fp8", "quant_fp8", "quant_int8"):
        with pytest.raises(ValueError, match=f"piecewise_graphs is not supported with {lossy}"):
            validate_engine(EngineConfig(cuda_graphs=True, piecewise_graphs=True, **{lossy: True}), "cuda")
    with pytest.raises(ValueError, match="runs on CUDA only"):
        validate_engine(EngineConfig(cuda_graphs=True, piecewise_graphs=True), "cpu")
    with pytest.raises(ValueError, match="piecewise_graphs with fused_kernels needs flash_attn"):
        validate_engine(EngineConfig(cuda_graphs=True, piecewise_graphs=True, fused_kernels=True), "cuda")
    # vLLM maps the switch onto its own graph mode: its quantized formats are not refused for it
    validate_engine(EngineConfig(name="vllm", cuda_graphs=True, piecewise_graphs=True, quant_fp8=True), "cuda")
    validate_engine(EngineConfig(cuda_graphs=True, piecewise_graphs=True, flash_attn=True), "cuda")


needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@needs_cuda
def test_fused_pieces_with_the_skinny_gemm_in_bf16_stay_within_rounding_of_the_eager_step():
    # the GEMV serves buckets of up to 16 rows in bf16: the 12-token first step pads to 16 and runs it
    from optladder.engine.model import DecodeKernels

    model = tiny_model(torch.bfloat16)
    eager = make_runner(model, fused=True)
    eager.kernels = DecodeKernels(fused=True, skinny=True)
    want_logits, _ = script(eager, PLAN)
    model = tiny_model(torch.bfloat16)
    runner = make_runner(model, fused=True)
    runner.kernels = DecodeKernels(fused=True, skinny=True)
    runner.piecewise = PiecewiseGraphRunner(model, DEVICE, 64, dummy_slot=NUM_SEQS * PER_SEQ * BLOCK,
                                            kernels=runner.kernels)
    got_logits, _ = script(runner, PLAN)
    for got, want in zip(got_logits[:3], want_logits[:3]):  # the three steps with prompt tokens
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)
    assert runner.piecewise.evidence()["steps"] == 3


@needs_cuda
def test_the_engine_with_piecewise_graphs_gives_the_eager_engines_tokens():
    # through LLMEngine: the runner's dummy slot, the cap min(max_num_batched_tokens, piecewise_max_tokens), the
    # evidence; float32 and naive attention, so any difference is the pieces', not rounding's
    from optladder.engine.config import EngineConfig
    from optladder.engine.llm_engine import LLMEngine
    from optladder.engine.sequence import SamplingParams
    import yaml
    from optladder.engine.config import ModelConfig

    def model_config(name):  # the YAML read directly (the GPU image has no omegaconf), the synthetic tokenizer (nor SmolLM2's files)
        cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "optladder" / "conf" / "model" / f"{name}.yaml").read_text())
        return ModelConfig(**{**cfg, "tokenizer": "synthetic"})

    def run(**kw):
        cfg = EngineConfig(device="cuda", dtype="float32", max_model_len=256, kv_cache_gb=0.05, paged_kv=True,
                           dynamic_batching=True, chunked_prefill=True, max_num_batched_tokens=48, max_num_seqs=8,
                           cuda_graphs=True, **kw)
        engine = LLMEngine(model_config("tiny"), cfg)
        g = torch.Generator().manual_seed(9)
        prompts = [torch.randint(1, 200, (n,), generator=g).tolist() for n in (70, 5, 33, 12)]
        seqs = engine.generate(prompts, SamplingParams(max_tokens=10))
        return [s.output_token_ids for s in seqs], engine.opts_effective()

    want, _ = run()
    got, eff = run(piecewise_graphs=True, piecewise_max_tokens=32)
    assert got == want
    pw = eff["piecewise_graphs"]
    assert pw["on"] and pw["buckets"] == [16, 32] and pw["steps"] > 0 and pw["eager_fallbacks"] > 0  # 48-token steps
