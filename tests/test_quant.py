"""The quantization opts (optladder/engine/quant.py) and the damaged-model knob (optladder/engine/damage.py) on a CPU: the
rounding, each kernel against a float64 reference, the swap's byte count, refusals before weights load,
and the engine's teacher-forced scoring (optladder/engine/scoring.py) against its own greedy decoding."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.damage import damage_model, parse_damage
from optladder.engine.llm_engine import LLMEngine
from optladder.engine.quant import (FP8_MAX, INT8_MAX, QuantLinear, QuantReport, dequantize_rows, quantize_rows,
                          quant_method, scaled_mm_fp8, validate_quant)
from optladder.engine.sequence import SamplingParams

CUDA = torch.cuda.is_available()
if not CUDA:  # before the first import of a kernel module: Triton picks the interpreter at decoration
    os.environ.setdefault("TRITON_INTERPRET", "1")
TINY = ModelConfig(name="tiny", source="random", package=None, gguf_file=None, tokenizer="synthetic",
                   vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=512, init_std=0.3)
BASE = dict(device="cpu", dtype="float32", max_model_len=128, kv_cache_gb=0.01)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def weight(n: int = 48, k: int = 96, seed: int = 0) -> torch.Tensor:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    w[3] *= 50  # an outlier row: a per-row scale keeps the other rows' precision
    w[5] = 0  # an all-zero row must not divide by zero
    return w


def test_int8_rounding_is_within_half_a_step_per_row():
    w = weight()
    q, s = quantize_rows(w, "int8")
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and q.abs().max() <= INT8_MAX
    err = (dequantize_rows(q, s, torch.float64) - w.double()).abs()
    assert (err <= s.double()[:, None] / 2 + 1e-6).all()
    assert torch.equal(q[5], torch.zeros_like(q[5]))
    assert (s[torch.arange(48) != 3] < s[3] / 10).all()  # the outlier row does not set the others' step


def test_fp8_rounding_keeps_three_mantissa_bits():
    w = weight()
    q, s = quantize_rows(w, "fp8")
    assert q.dtype == torch.float8_e4m3fn and q.float().abs().max() <= FP8_MAX
    rel = ((dequantize_rows(q, s, torch.float64) - w.double()).abs() / w.double().abs().clamp_min(1e-30))
    normal = w.abs() > s[:, None] * 2 ** -6  # E4M3's normal range, scaled
    assert rel[normal].max() <= 2 ** -4 + 1e-6  # half an ulp of a 3-bit mantissa


@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_quant_linear_matches_its_dequantized_weights(method: str):
    lin = nn.Linear(96, 48, bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight())
    mod = QuantLinear(lin, method, QuantReport(method))
    assert not hasattr(mod, "weight")  # code expecting a dense .weight fails loudly
    x = torch.randn(4, 5, 96)  # 20 rows: more than a decode kernel takes (CPU_INT8_MAX_M)
    ref = x.double() @ dequantize_rows(mod.qweight, mod.scales, torch.float64).t()
    out = mod(x)
    assert out.shape == (4, 5, 48) and out.dtype == torch.float32
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-4)
    assert mod.report.kernels == {f"dequant_linear_{method}": 1}


def test_cpu_bf16_decode_rows_run_the_int8_kernel():
    lin = nn.Linear(96, 48, bias=False)
    mod = QuantLinear(lin, "int8", QuantReport("int8"))
    x = torch.randn(4, 96).to(torch.bfloat16)
    ref = x.double() @ dequantize_rows(mod.qweight, mod.scales, torch.float64).t()
    out = mod(x)
    assert mod.report.kernels == {"weight_int8pack_mm": 1}
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2  # bf16 output rounding


def test_cpu_int8_c_kernel_against_float64():
    from optladder.engine.kernels import cpu_int8

    if cpu_int8.kernel() is None:
        pytest.skip(cpu_int8.unavailable())
    for n, k in ((70, 200), (1, 5), (4, 128), (9, 300)):  # N not a multiple of 4, K not of the 128-wide slices
        q, s = quantize_rows(weight(max(n, 6), k)[:n], "int8")
        for m in (1, 3, 16, 64):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            ref = x.double() @ dequantize_rows(q, s, torch.float64).t()
            out = cpu_int8.int8_linear(x, q, s)
            assert out.shape == (m, n) and out.dtype == torch.float32
            err = (out.double() - ref).abs().max().item()
            assert err <= 1e-5 * ref.abs().max().item() + 1e-6, (n, k, m, err)  # float32 sums, another order
    # two threads (the rows split between them) and strided inputs (taken as contiguous copies)
    q, s = quantize_rows(weight(70, 400), "int8")
    x = torch.randn(5, 800)[:, ::2]
    ref = x.double() @ dequantize_rows(q, s, torch.float64).t()
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = cpu_int8.int8_linear(x, q.t().contiguous().t(), s)
    finally:
        torch.set_num_threads(n)
    assert (out.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item() + 1e-6
    with pytest.raises(ValueError, match="1 <= M <= 64"):
        cpu_int8.int8_linear(torch.randn(65, 200), *quantize_rows(weight(70, 200), "int8"))
    with pytest.raises(ValueError, match=r"x \[M, K\]"):
        cpu_int8.int8_linear(torch.randn(200), *quantize_rows(weight(70, 200), "int8"))
    with pytest.raises(TypeError, match="float32 rows"):
        cpu_int8.int8_linear(torch.randn(2, 200).double(), *quantize_rows(weight(70, 200), "int8"))


def test_cpu_float32_decode_rows_run_the_c_kernel():
    from optladder.engine.kernels import cpu_int8

    lin = nn.Linear(96, 48, bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight())
    x = torch.randn(4, 96)
    if cpu_int8.kernel() is None:
        pytest.skip(cpu_int8.unavailable())
    # the kernel is there: decode rows run it, prompt rows dequantize
    mod = QuantLinear(lin, "int8", QuantReport("int8"))
    ref = mod(torch.randn(20, 96))  # a prefill's rows: dequantized
    out = mod(x)
    assert mod.report.kernels == {"dequant_linear_int8": 1, "cpu_int8_gemm_c": 1} and ref.shape == (20, 48)
    assert torch.allclose(out.double(), x.double() @ dequantize_rows(mod.qweight, mod.scales, torch.float64).t(),
                          rtol=1e-5, atol=1e-5)
    assert "notes" not in mod.report.evidence()


def test_cpu_int8_without_the_c_kernel_dequantizes_and_says_why(monkeypatch, tmp_path):
    from optladder.engine.kernels import cpu_int8

    lin = nn.Linear(96, 48, bias=False)
    x = torch.randn(4, 96)
    # turned off: the dequantizing path runs, and the evidence says why
    monkeypatch.setattr(cpu_int8, "ENABLED", False)
    mod = QuantLinear(lin, "int8", QuantReport("int8"))
    mod(x)
    ev = mod.report.evidence()
    assert ev["kernels"] == {"dequant_linear_int8": 1} and "turned off" in ev["notes"][0]
    # no working compiler: not built, the reason is kept, nothing raises
    monkeypatch.setattr(cpu_int8, "ENABLED", True)
    for name, value in (("_tried", False), ("_fn", None), ("_why", None)):
        monkeypatch.setattr(cpu_int8, name, value)
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("OPTLADDER_CACHE", str(tmp_path))
    mod = QuantLinear(lin, "int8", QuantReport("int8"))
    mod(x)
    ev = mod.report.evidence()
    assert ev["kernels"] == {"dequant_linear_int8": 1} and "could not be built: /bin/false failed" in ev["notes"][0]
    assert not list(tmp_path.rglob("*.so"))


def test_scaled_mm_fp8_quantizes_activations_per_token():
    q, s = quantize_rows(weight(), "fp8")
    x = torch.randn(20, 96)
    x[7] *= 1e4  # one loud token: with a per-tensor scale the others would fall into E4M3's subnormals
    w = dequantize_rows(q, s, torch.float64)
    err = (scaled_mm_fp8(x, q, s).double() - x.double() @ w.t()).abs()
    # each product term is off by at most E4M3's half ulp (2^-4) of the activation: bound by |x_i| |w_j|
    bound = x.double().norm(dim=1)[:, None] * w.norm(dim=1)[None, :]
    assert (err <= 2 ** -4 * bound + 1e-9).all() and (err / bound.clamp_min(1e-30)).median() < 2 ** -7


@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_wq_gemv_kernel_against_float64(method: str):
    pytest.importorskip("triton")
    from optladder.engine.kernels.wq_gemv import wq_linear

    device = "cuda" if CUDA else "cpu"
    q, s = (t.to(device) for t in quantize_rows(weight(70, 200), method))  # N and K not multiples of the tiles
    for m, kernel in ((1, "row"), (1, "dot"), (1, "auto"), (3, "auto"), (16, "auto"), (33, "auto"), (64, "auto")):
        x = torch.randn(m, 200, device=device).to(torch.bfloat16)
        ref = x.double() @ dequantize_rows(q, s, torch.float64).t()
        out = wq_linear(x, q, s, kernel=kernel)
        assert out.dtype == torch.bfloat16 and out.shape == (m, 70)
        assert ((out.double() - ref).norm() / ref.norm()).item() < 8e-3, (m, kernel)  # one bf16 rounding
    q, s = (t.to(device) for t in quantize_rows(weight(64, 512), method))  # tiles that divide the shape: no masks
    x = torch.randn(1, 512, device=device).to(torch.bfloat16)
    ref = x.double() @ dequantize_rows(q, s, torch.float64).t()
    for kernel in ("row", "dot"):
        assert ((wq_linear(x, q, s, kernel=kernel).double() - ref).norm() / ref.norm()).item() < 8e-3, kernel


def test_quant_int8_engine_reports_the_bytes_it_saved():
    plain = LLMEngine(TINY, EngineConfig(**BASE))
    quant = LLMEngine(TINY, EngineConfig(**BASE, quant_int8=True))
    ev = quant.opts_effective()["quant_int8"]
    dense = [m for layer in plain.model.layers for m in layer.children() if isinstance(m, nn.Linear)]
    saved = sum(m.weight.numel() * 3 - m.out_features * 4 for m in dense)  # 4 bytes -> 1, plus a scale a row
    assert ev["on"] and ev["linear_layers"] == len(dense) == 8
    assert ev["weight_bytes_before"] - ev["weight_bytes_after"] == saved
    assert plain.opts_effective()["quant_int8"]["on"] is False
    out = quant.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4))[0]
    assert out.num_output_tokens == 4 and quant.opts_effective()["quant_int8"]["kernels"]


def test_quantization_refused_before_weights_load():
    with pytest.raises(ValueError, match=r"quant_fp8 runs on CUDA only.*drop \+opt=quant_fp8"):
        LLMEngine(ModelConfig(name="missing", source="hf_dir", path="/nonexistent"), EngineConfig(quant_fp8=True,
                                                                                                  device="cpu"))
    with pytest.raises(ValueError, match="quant_int8 and quant_fp8 both quantize the weights: pick one"):
        quant_method(EngineConfig(quant_int8=True, quant_fp8=True))


def test_damage_specs():
    with pytest.raises(ValueError, match=r"model.damage='half' is not one of \['round_bits:<int>', 'zero_layer"):
        parse_damage("half", 30)
    with pytest.raises(ValueError, match="the model has layers 0..29"):
        parse_damage("zero_layer:30", 30)
    with pytest.raises(ValueError, match="2 to 8 bits"):
        parse_damage("round_bits:1", 30)
    layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 32, bias=False), nn.Linear(32, 16, bias=False))
                           for _ in range(3))
    before = [m.weight.clone() for m in layers.modules() if isinstance(m, nn.Linear)]
    assert damage_model(layers, "zero_layer:1") == 2
    after = [m.weight for m in layers.modules() if isinstance(m, nn.Linear)]
    assert all(torch.equal(a, b) for a, b in zip(after[:2] + after[4:], before[:2] + before[4:]))
    assert not after[2].any() and not after[3].any()
    assert damage_model(layers, "round_bits:3") == 6
    assert all(len(row.unique()) <= 7 for row in after[0])  # levels -3..3 times the row's scale


def test_score_of_the_engines_own_greedy_output_picks_it_at_every_position():
    """Teacher forcing through the prefill path must see what decoding saw: the argmax at each scored position
    is the token greedy decoding chose there. With prefix caching on, no position may be skipped."""
    engine = LLMEngine(TINY, EngineConfig(**BASE, paged_kv=True, prefix_cache=True, block_size=4))
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8]]
    seqs = engine.generate(prompts, SamplingParams(max_tokens=12))
    full = [s.token_ids for s in seqs] * 2  # twice: the second copy's full blocks are in the prefix cache
    starts = [len(p) for p in prompts] * 2
    lps = engine.score(full, starts)
    for lp, ids, start in zip(lps, full, starts):
        assert lp.shape == (len(ids) - start, 512) and lp.dtype == torch.float32 and lp.device.type == "cpu"
        assert lp.argmax(-1).tolist() == ids[start:]
        assert torch.allclose(lp.exp().sum(-1), torch.ones(len(ids) - start), atol=1e-5)
    assert torch.equal(lps[0], lps[2])
    assert engine.block_manager.all_free() and engine.block_manager.prefix_hits == 0
    with pytest.raises(ValueError, match=r"start=0 must be in \[1, 2\]"):
        engine.score([[1, 2, 3]], [0])


def test_quant_fp8_needs_fp8_tensor_cores_bf16_and_sizes_of_16(monkeypatch):
    """The capability check, with the GPU's answers given: refused on an A100 (8.0), taken on an H200 (9.0)."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match=r"capability >= 8.9.*NVIDIA A100 has 8.0: use \+opt=quant_int8"):
        validate_quant("fp8", "bfloat16", cuda, (4096, 14336))
    validate_quant("int8", "bfloat16", cuda, (4096, 14336))  # int8 needs no FP8 tensor cores
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    validate_quant("fp8", "bfloat16", cuda, (4096, 14336))
    with pytest.raises(ValueError, match="not engine.dtype=float32: set engine.dtype=bfloat16"):
        validate_quant("fp8", "float32", cuda, (4096,))
    with pytest.raises(ValueError, match=r"multiples of 16, this model has \[100\]"):
        validate_quant("fp8", "bfloat16", cuda, (4096, 100))


def test_vllm_maps_fp8_weights_and_refuses_int8():
    from optladder.backends.vllm_args import build_launch

    def launch(**kw):
        cfg = EngineConfig(name="vllm", block_size=128, dtype="bfloat16", **kw)
        return build_launch(cfg, "cuda", "/models/smol", "smol", "127.0.0.1", 8123)

    on, off = launch(quant_fp8=True), launch()
    assert on.args[on.args.index("--quantization") + 1] == "fp8" and "--quantization" not in off.args
    assert on.opts_effective["quant_fp8"]["on"] is True and off.opts_effective["quant_fp8"]["on"] is False
    with pytest.raises(ValueError, match=r"engine=vllm has no mapping for opt\(s\) \['quant_int8'\]"):
        launch(quant_int8=True)
    kv = launch(kv_fp8=True)
    assert kv.args[kv.args.index("--kv-cache-dtype") + 1] == "fp8" and "--kv-cache-dtype" not in off.args
    assert kv.opts_effective["kv_fp8"]["on"] is True


# --- kv_fp8 ---

def test_fp8_kv_store_and_gather_round_trip_per_token_and_head():
    from optladder.engine.kv_quant import QuantKV

    cache = QuantKV.zeros(6, 4, 2, 16, torch.float32, torch.device("cpu"))
    x = torch.randn(5, 2, 16)
    x[2, 1] *= 1000  # one loud head of one token: its scale is its own
    slots = torch.tensor([3, 0, 9, 22, 17])
    cache.store(x, slots)
    got = cache.gather(torch.tensor([[0, 1, 2, 3, 4, 5]]), 24)[0]  # [24, 2, 16], slot order
    assert got.dtype == torch.float32 and cache.data.dtype == torch.float8_e4m3fn
    err = (got[slots] - x).abs()
    amax = x.abs().amax(-1, keepdim=True)
    assert (err <= 2 ** -4 * x.abs() + amax / 448 * 2 ** -9 + 1e-12).all()  # half an ulp, or a subnormal step
    assert got[[1, 2, 4]].abs().sum() == 0  # untouched slots stay zero


def test_paged_decode_kernel_reads_the_fp8_cache():
    pytest.importorskip("triton")
    from optladder.engine.kernels.paged_decode import paged_decode_attention
    from optladder.engine.kernels.reference import paged_decode_reference, rel_error
    from optladder.engine.kv_quant import QuantKV

    device = torch.device("cuda" if CUDA else "cpu")
    dtype = torch.bfloat16 if CUDA else torch.float32
    gen = torch.Generator().manual_seed(3)
    b, h, kvh, d, bs, nb = 3, 8, 2, 64, 16, 12
    k, v = QuantKV.zeros(nb, bs, kvh, d, dtype, device), QuantKV.zeros(nb, bs, kvh, d, dtype, device)
    k.store(torch.randn(nb * bs, kvh, d, generator=gen).to(device), torch.arange(nb * bs, device=device))
    v.store(torch.randn(nb * bs, kvh, d, generator=gen).to(device) * 3, torch.arange(nb * bs, device=device))
    q = torch.randn(b, h, d, generator=gen).to(device, dtype)
    tables = torch.randperm(nb, generator=gen)[:b * 4].view(b, 4).int().to(device)
    ctx = torch.tensor([64, 37, 1], dtype=torch.int32, device=device)
    dense_k = k.dequantize(k.data, k.scale).float()
    dense_v = v.dequantize(v.data, v.scale).float()
    ref = paged_decode_reference(q.float(), dense_k, dense_v, tables, ctx)
    for splits in (1, 3):
        out = paged_decode_attention(q, k, v, tables, ctx, splits=splits)
        assert rel_error(out, ref) < (1e-2 if CUDA else 1e-5)


def test_varlen_kernel_reads_the_fp8_cache():
    """Mixed steps (chunks after a cache, decode rows) over an fp8 cache, against float64 over its values."""
    pytest.importorskip("triton")
    from optladder.engine.kernels.paged_prefill import block_q, paged_prefill_attention, tile_list
    from optladder.engine.kernels.reference import paged_prefill_reference, rel_error
    from optladder.engine.kv_quant import QuantKV

    device = torch.device("cuda" if CUDA else "cpu")
    dtype = torch.bfloat16 if CUDA else torch.float32
    gen = torch.Generator().manual_seed(5)
    h, kvh, d, bs, q_lens, ctx = 6, 2, 32, 4, [5, 1, 17, 3], [5, 9, 30, 40]
    nb = sum(-(-c // bs) for c in ctx) + 2
    k, v = QuantKV.zeros(nb, bs, kvh, d, dtype, device), QuantKV.zeros(nb, bs, kvh, d, dtype, device)
    k.store(torch.randn(nb * bs, kvh, d, generator=gen).to(device), torch.arange(nb * bs, device=device))
    v.store(torch.randn(nb * bs, kvh, d, generator=gen).to(device), torch.arange(nb * bs, device=device))
    perm, tables = torch.randperm(nb, generator=gen).tolist(), torch.zeros(4, 10, dtype=torch.int32)
    for i, c in enumerate(ctx):  # each sequence its own blocks, in no particular order
        n = -(-c // bs)
        tables[i, :n] = torch.tensor(perm[:n])
        perm = perm[n:]
    tables = tables.to(device)
    q = torch.randn(sum(q_lens), h, d, generator=gen).to(device, dtype)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    tiles = torch.tensor(tile_list(q_lens, block_q(h, kvh)), dtype=torch.int32, device=device)
    out = paged_prefill_attention(q, k, v, tables, starts, torch.tensor(ctx, device=device), tiles,
                                  out=torch.full_like(q, float("nan")))
    ref = paged_prefill_reference(q, k.dequantize(k.data, k.scale), v.dequantize(v.data, v.scale), tables, q_lens, ctx)
    assert rel_error(out, ref) <= (1e-2 if CUDA else 1e-5)


def test_kv_fp8_engine_halves_the_bytes_and_scoring_sees_the_quantized_cache():
    from optladder.engine.kv_quant import QuantKV

    plain = LLMEngine(TINY, EngineConfig(**BASE, paged_kv=True, flash_attn=True))
    fp8 = LLMEngine(TINY, EngineConfig(**BASE, paged_kv=True, flash_attn=True, kv_fp8=True))
    assert fp8.bytes_per_token == 2 * 2 * 2 * (16 + 2) and plain.bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert fp8.block_manager.num_blocks >= 3.5 * plain.block_manager.num_blocks  # float32 -> 1 byte + scales
    assert isinstance(fp8.model.layers[0].k_cache, QuantKV)
    ev = fp8.opts_effective()["kv_fp8"]
    assert ev["on"] and ev["kv_bytes_per_token"] == 144 and ev["model_dtype_kv_bytes_per_token"] == 512
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8]]
    seqs = fp8.generate(prompts, SamplingParams(max_tokens=12))
    full, starts = [s.token_ids for s in seqs], [len(p) for p in prompts]
    mine, theirs = fp8.score(full, starts), plain.score(full, starts)
    for lp, ids, start, other in zip(mine, full, starts, theirs):
        assert lp.argmax(-1).tolist() == ids[start:]  # decoding read the fp8 cache, and so did scoring
        assert torch.allclose(lp[0], other[0], atol=1e-5)  # the prompt's last position: fresh keys, no cache
        assert not torch.allclose(lp[1:], other[1:], atol=1e-5)  # later positions read the cache back
    assert fp8.block_manager.all_free()
