"""Issue 4 on one GPU, in one run: correctness checks, then micro-benchmarks, then JSON + a markdown table.

    python benchmarks/gpu_bench.py --out DIR [--smollm2-cache DIR]     (benchmarks/gpu_run.sh on the H200)

1. copy bandwidth (bytes read + written), the ceiling every floor below is computed from;
2. kernels against float64 on fresh random inputs, outputs poisoned first (NaN never passes): the paged
   decode kernel (paged and contiguous layouts, split-K, GQA groups of 4 and 3), the fused decode-step
   kernels and the skinny GEMM, flash and naive prefill; and one whole decode step, graph-replayed vs eager;
3. prefill of 512/2048/4096 tokens on llama3_8b_shape, naive vs flash: time and peak memory;
4. decode step at batch 1/8/32/64 on llama3_8b_shape (bf16, random weights, 1024-token contexts), paged
   and contiguous KV, eager vs CUDA graphs (with and without the fused kernels and the skinny GEMM),
   each against the floor of reading the weights and the KV once at the measured bandwidth;
5. greedy outputs of SmolLM2 (bf16) with and without each switch on 32 builtin prompts.
Imports only torch, transformers (through engine.loader) and triton, and the engine.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.attention import AttnMeta, FusedAttention, NaiveAttention  # noqa: E402
from engine.config import EngineConfig, ModelConfig  # noqa: E402
from engine.cuda_graphs import CUDAGraphRunner  # noqa: E402
from engine.kernels import fused  # noqa: E402
from engine.kernels.gemv import skinny_linear  # noqa: E402
from engine.kernels.paged_decode import paged_decode_attention  # noqa: E402
from engine.kernels.reference import attention_reference, paged_decode_reference, rel_error  # noqa: E402
from engine.loader import load_model  # noqa: E402
from engine.model_runner import ModelRunner, kv_bytes_per_token  # noqa: E402
from engine.sequence import SamplingParams, Sequence  # noqa: E402

DEV = torch.device("cuda")
BF16 = torch.bfloat16
TOL = 1e-2
LLAMA8B = ModelConfig(name="llama3_8b_shape", source="random", package=None, gguf_file=None, tokenizer="synthetic",
                      vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                      max_position_embeddings=8192, tie_word_embeddings=False)
RESULTS: dict = {}


def log(*a) -> None:
    print(*a, flush=True)


def save(out: Path) -> None:
    (out / "gpu_bench.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def section(name: str, out: Path):
    """Run one section; a failure is recorded and the next section still runs."""
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            RESULTS[name] = fn()
        except Exception as e:  # noqa: BLE001 - the run must go on and report what failed
            RESULTS[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            log(f"!! {name} failed: {e}")
        RESULTS.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
        save(out)
        return fn
    return wrap


def gpu_median_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def wall_median_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def poison_allocator(mb: int = 512) -> None:
    """Fill memory the caching allocator will hand out next with NaN: an output the kernel forgets to
    write then shows up as NaN instead of as stale zeros."""
    torch.empty(mb << 20, dtype=torch.uint8, device=DEV).view(BF16).fill_(float("nan"))


# --- 0. environment and bandwidth ---

def environment(cmd: str) -> dict:
    import transformers
    import triton

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    p = torch.cuda.get_device_properties(DEV)
    return {"command": cmd, "gpu": p.name, "nvidia_smi": smi, "sms": p.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def copy_bandwidth() -> dict:
    n = 4 << 30  # 4 GiB each way: far past the 60 MB L2
    src = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    ms = gpu_median_ms(lambda: dst.copy_(src), iters=20)
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes_each_way": n, "ms": ms, "tb_s": 2 * n / ms / 1e9, "counted": "read + written"}


# --- 1. correctness ---

def check_paged_decode() -> list[dict]:
    rows = []
    cases = [  # name, batch, heads, kv_heads, head_dim, block_size, max_len, splits, dtype
        ("8B-shape paged, batch 1, split-K", 1, 32, 8, 128, 16, 2048, None, BF16),
        ("8B-shape paged, batch 8, split-K", 8, 32, 8, 128, 16, 1024, None, BF16),
        ("8B-shape paged, batch 33, no split", 33, 32, 8, 128, 16, 1024, None, BF16),
        ("8B-shape paged, fp16, 5 splits", 4, 32, 8, 128, 16, 777, 5, torch.float16),
        ("8B-shape contiguous (block = max_model_len)", 4, 32, 8, 128, 2048, 2048, None, BF16),
        ("SmolLM2-shape (group 3, head_dim 64)", 6, 9, 3, 64, 16, 300, None, BF16),
        ("head_dim 256, block 32", 3, 16, 2, 256, 32, 500, None, BF16),
        ("head_dim 96 (no power of 2), MHA", 3, 8, 8, 96, 16, 200, 2, BF16),
    ]
    for name, b, h, kvh, d, bs, max_len, splits, dt in cases:
        for trial in range(2):  # fresh inputs per check
            g = torch.Generator(device=DEV).manual_seed(random.randrange(1 << 30))
            per = -(-max_len // bs)
            nb = b * per + 3
            q = torch.randn(b, h, d, device=DEV, generator=g).to(dt)
            kc = torch.randn(nb, bs, kvh, d, device=DEV, generator=g).to(dt)
            vc = torch.randn(nb, bs, kvh, d, device=DEV, generator=g).to(dt)
            bt = torch.randperm(nb, device=DEV, generator=g)[:b * per].view(b, per).int()
            ctx = torch.randint(1, max_len + 1, (b,), device=DEV, generator=g).int()
            ctx[0] = max_len
            out = torch.full_like(q, float("nan"))
            paged_decode_attention(q, kc, vc, bt, ctx, out=out, splits=splits)
            err = rel_error(out, paged_decode_reference(q, kc, vc, bt, ctx))
            rows.append({"check": f"paged decode: {name}", "trial": trial, "rel_err": err, "ok": err <= TOL})
    return rows


def check_fused() -> list[dict]:
    rows = []
    g = torch.Generator(device=DEV).manual_seed(random.randrange(1 << 30))
    rnd = lambda *s: torch.randn(*s, device=DEV, generator=g).to(BF16)  # noqa: E731
    for t, hidden in ((1, 4096), (64, 4096), (7, 576)):
        x, r, w = rnd(t, hidden), rnd(t, hidden), rnd(hidden)
        poison_allocator()
        y, r_out = fused.add_rmsnorm(x, r, w, 1e-5)
        s = x.double() + r.double()
        ref = w.double() * s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5)
        rows.append({"check": f"add_rmsnorm [{t}, {hidden}]", "rel_err": max(rel_error(y, ref), rel_error(r_out, s))})
        gu = rnd(t, 2 * hidden)
        poison_allocator()
        got = fused.silu_mul(gu)
        gd, ud = gu.double().chunk(2, dim=-1)
        rows.append({"check": f"silu_mul [{t}, {hidden}]", "rel_err": rel_error(got, torch.nn.functional.silu(gd) * ud)})
    for t, nh, nkv, hd in ((1, 32, 8, 128), (40, 32, 8, 128), (9, 9, 3, 64)):
        qkv = rnd(t, (nh + 2 * nkv) * hd)
        pos = torch.randint(0, 8192, (t,), device=DEV)
        slots = torch.randperm(64 * 16, device=DEV)[:t]
        kc = torch.full((64, 16, nkv, hd), float("nan"), dtype=BF16, device=DEV)
        vc = torch.full_like(kc, float("nan"))
        inv = 1.0 / 500000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64, device=DEV) / hd)
        ang = torch.outer(torch.arange(8192, dtype=torch.float64, device=DEV), inv)
        emb = torch.cat([ang, ang], -1)
        poison_allocator()
        q = fused.rope_store_kv(qkv, pos, emb.cos().float(), emb.sin().float(), slots, kc, vc, nh, nkv, hd)
        c, s = emb.cos()[pos][:, None], emb.sin()[pos][:, None]
        qd, kd, vd = qkv.double().split([nh * hd, nkv * hd, nkv * hd], -1)

        def rope(x):
            x1, x2 = x.chunk(2, -1)
            return x * c + torch.cat([-x2, x1], -1) * s

        qr, kr = rope(qd.view(t, nh, hd)), rope(kd.view(t, nkv, hd))
        err = max(rel_error(q, qr), rel_error(kc.view(-1, nkv, hd)[slots], kr),
                  rel_error(vc.view(-1, nkv, hd)[slots], vd.view(t, nkv, hd)))
        rows.append({"check": f"rope_store_kv T={t} heads {nh}/{nkv} hd {hd}", "rel_err": err})
    for m in (1, 5, 16):
        for n, k, silu in ((6144, 4096, False), (4096, 14336, False), (2 * 14336, 4096, True), (960, 576, False),
                           (2 * 1536, 576, True)):
            x, w = rnd(m, k), rnd(n, k) * 0.02
            poison_allocator()
            got = skinny_linear(x, w, silu_mul=silu)
            ref = x.double() @ w.double().T
            if silu:
                gd, ud = ref.chunk(2, dim=-1)
                ref = torch.nn.functional.silu(gd) * ud
            rows.append({"check": f"skinny GEMM{' + SiLU·mul' if silu else ''} M={m} N={n} K={k}",
                         "rel_err": rel_error(got, ref)})
    for r in rows:
        r["ok"] = r["rel_err"] <= TOL
    return rows


def check_prefill() -> list[dict]:
    rows = []
    for backend in (FusedAttention(DEV), NaiveAttention()):
        for lens, ctxs, h, kvh, d in (([1000], [1000], 32, 8, 128), ([300, 77], [300, 77], 9, 3, 64),
                                      ([64], [320], 32, 8, 128)):  # last: a prefix-cache hit, 256 cached
            g = torch.Generator(device=DEV).manual_seed(random.randrange(1 << 30))
            tq = sum(lens)
            q = torch.randn(tq, h, d, device=DEV, generator=g).to(BF16)
            k = torch.randn(tq, kvh, d, device=DEV, generator=g).to(BF16)
            v = torch.randn(tq, kvh, d, device=DEV, generator=g).to(BF16)
            bs = 16
            per = [-(-c // bs) for c in ctxs]
            kc = torch.randn(sum(per) + 1, bs, kvh, d, device=DEV, generator=g).to(BF16)
            vc = torch.randn_like(kc)
            tables, slots, start = [], [], 0
            for i, (ql, c) in enumerate(zip(lens, ctxs)):
                blocks = list(range(sum(per[:i]), sum(per[:i + 1])))
                tables.append(blocks + [0] * (max(per) - len(blocks)))
                slots += [blocks[p // bs] * bs + p % bs for p in range(c - ql, c)]
            slots_t = torch.tensor(slots, device=DEV)
            kc.view(-1, kvh, d)[slots_t], vc.view(-1, kvh, d)[slots_t] = k, v  # what store_kv does first
            meta = AttnMeta(True, slots_t, torch.tensor(tables, dtype=torch.int32, device=DEV),
                            torch.tensor(ctxs, device=DEV), max(ctxs), lens, ctxs)
            poison_allocator()
            out = backend.prefill(q, k, v, meta, kc, vc)
            refs, start = [], 0
            for i, (ql, c) in enumerate(zip(lens, ctxs)):
                pos = torch.arange(c, device=DEV)
                blocks = meta.block_tables[i, pos // bs].long()
                refs.append(attention_reference(q[start:start + ql], kc[blocks, pos % bs], vc[blocks, pos % bs], True))
                start += ql
            err = rel_error(out, torch.cat(refs))
            rows.append({"check": f"prefill {backend.name}: q {lens} ctx {ctxs}, heads {h}/{kvh}, hd {d}",
                         "rel_err": err, "ok": err <= TOL})
    return rows


# --- 2. llama3_8b_shape ---

def weights_read_bytes(model) -> int:
    """What a decode step must read: every weight once, except the embedding table (B rows of it)."""
    emb = model.embed_tokens.weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not emb)


def make_runner(model, paged: bool, flash: bool, graphs: bool, seqs_n: int, max_len: int,
                fused: bool = True, skinny: bool = True) -> ModelRunner:
    """A runner with room for seqs_n sequences of max_len; graphs as the engine builds them (fused
    kernels, skinny GEMM), or recaptured without them to measure what each buys."""
    bs = 16 if paged else max_len
    cfg = EngineConfig(paged_kv=paged, flash_attn=flash, cuda_graphs=graphs, max_model_len=max_len,
                       batch_size=seqs_n, max_num_seqs=seqs_n, block_size=16)
    runner = ModelRunner(model, DEV, BF16, seqs_n * (max_len // bs), bs, cfg)
    if graphs and not (fused and skinny):
        dummy = runner.graphs.dummy_slot // bs
        runner.graphs = None
        runner.graphs = CUDAGraphRunner(model, DEV, seqs_n, max_len, bs, dummy_block=dummy, fused=fused,
                                        skinny=skinny)
    gen = torch.Generator(device=DEV).manual_seed(7)
    for layer in model.layers:  # random KV, never zeros
        layer.k_cache.normal_(generator=gen)
        layer.v_cache.normal_(generator=gen)
    return runner


def decode_seqs(n: int, ctx: int, runner: ModelRunner, vocab: int) -> list[Sequence]:
    bs = runner.block_size
    blocks = list(range(runner.model.layers[0].k_cache.shape[0] - (1 if runner.graphs else 0)))
    random.Random(n).shuffle(blocks)  # a fragmented pool, as paged KV leaves it
    seqs = []
    for i in range(n):
        s = Sequence(f"d{i}", [random.randrange(3, vocab) for _ in range(ctx)], SamplingParams())
        s.block_table = [blocks.pop() for _ in range(-(-ctx // bs))]
        seqs.append(s)
    return seqs


def prefill_bench(model) -> list[dict]:
    rows = []
    for flash in (False, True):
        runner = make_runner(model, paged=False, flash=flash, graphs=False, seqs_n=1, max_len=4096)
        for t in (512, 2048, 4096):
            seq = decode_seqs(1, t, runner, model.shape.vocab_size)[0]
            torch.cuda.synchronize()
            runner.forward([seq], True)  # warm-up
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            ms = wall_median_ms(lambda: runner.forward([seq], True), iters=5, warmup=1)
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
            step_ms = wall_median_ms(lambda: runner.forward(seqs, False), iters=30)
            if runner.graphs:
                bucket = next(x for x in runner.graphs.buckets if x >= b)
                runner.forward(seqs, False)
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
                got = runner.forward(seqs, False).clone()
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


# --- 3. SmolLM2 greedy outputs ---

SWITCHES = {
    "baseline": {}, "float32 reference (baseline in float32)": dict(dtype="float32"),
    "flash_attn": dict(flash_attn=True), "cuda_graphs": dict(cuda_graphs=True),
    "flash_attn+cuda_graphs": dict(flash_attn=True, cuda_graphs=True), "paged_kv": dict(paged_kv=True),
    "paged_kv+flash_attn": dict(paged_kv=True, flash_attn=True),
    "paged_kv+cuda_graphs": dict(paged_kv=True, cuda_graphs=True),
    "paged_kv+flash_attn+cuda_graphs": dict(paged_kv=True, flash_attn=True, cuda_graphs=True),
    "paged_kv+flash_attn+cuda_graphs, static batching": dict(paged_kv=True, flash_attn=True, cuda_graphs=True,
                                                             dynamic_batching=False),
}


def smollm2_greedy(cache_dir: str, num_prompts: int = 32, max_tokens: int = 96) -> dict:
    from engine.llm_engine import LLMEngine
    from engine.tokenizer import chat_token_ids

    mcfg = ModelConfig(cache_dir=cache_dir)
    lines = (ROOT / "quality" / "builtin_prompts.jsonl").read_text().splitlines()[:num_prompts]
    texts = [json.loads(x)["prompt"] for x in lines]
    runs, evidence, prompts = {}, {}, None
    for name, kw in SWITCHES.items():
        cfg = EngineConfig(**{**dict(dtype="bfloat16", device="cuda", max_model_len=1024, kv_cache_gb=1.0,
                                     dynamic_batching=True, max_num_seqs=32, batch_size=8, batched_decode=True),
                              **kw})
        eng = LLMEngine(mcfg, cfg)
        if prompts is None:
            prompts = [chat_token_ids(eng.tokenizer, t) for t in texts]
        seqs = eng.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=False))
        runs[name] = [s.output_token_ids for s in seqs]
        evidence[name] = {k: eng.opts_effective()[k] for k in ("flash_attn", "cuda_graphs", "paged_kv")}
        if name == "baseline":  # eager twice: is the baseline itself deterministic?
            runs["baseline (again)"] = [s.output_token_ids for s in
                                        eng.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=False))]
        del eng
        torch.cuda.empty_cache()
        log(f"smollm2 {name}: done")
    base, f32 = runs["baseline"], runs["float32 reference (baseline in float32)"]
    table = []
    for name, outs in runs.items():
        if name == "baseline":
            continue
        firsts = [first_divergence(a, b) for a, b in zip(base, outs)]
        diverged = [f for f in firsts if f is not None]
        vs_f32 = [first_divergence(a, b) for a, b in zip(f32, outs)]
        table.append({"config": name, "identical": sum(f is None for f in firsts), "prompts": len(firsts),
                      "share_identical": sum(f is None for f in firsts) / len(firsts),
                      "first_divergence_positions": sorted(diverged),
                      "identical_to_float32": sum(f is None for f in vs_f32),
                      "mean_output_tokens": sum(map(len, outs)) / len(outs), "opts_effective": evidence.get(name)})
    table.append({"config": "baseline", "identical": len(base), "prompts": len(base), "share_identical": 1.0,
                  "first_divergence_positions": [],
                  "identical_to_float32": sum(first_divergence(a, b) is None for a, b in zip(f32, base)),
                  "mean_output_tokens": sum(map(len, base)) / len(base)})
    return {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized, run in bf16; one float32 run as reference)",
            "prompts": num_prompts,
            "max_tokens": max_tokens, "stop_at_eos": True, "compared_to": "baseline (naive attention, contiguous "
            "KV, eager), dynamic batching on in every config unless stated", "rows": table}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# --- report ---

def markdown() -> str:
    r = RESULTS
    env, bw = r.get("environment", {}), r.get("bandwidth", {})
    lines = [f"# GPU bench: {env.get('gpu')} ({env.get('nvidia_smi')})", "",
             f"torch {env.get('torch')} (CUDA {env.get('cuda')}), triton {env.get('triton')}, transformers "
             f"{env.get('transformers')}, {env.get('date_utc')} UTC. Command: `{env.get('command')}`", "",
             f"Copy bandwidth: {bw.get('tb_s', float('nan')):.2f} TB/s (read + written, 4 GiB each way).", ""]
    checks = [c for k in ("check_paged_decode", "check_fused", "check_prefill", "check_decode_step")
              for c in (r.get(k) if isinstance(r.get(k), list) else [])]
    if checks:
        lines += ["## Correctness (rel. error vs float64, or as named; ≤ 1e-2 passes, NaN never)", "",
                  "| check | rel. error | ok |", "|---|---|---|"]
        lines += [f"| {c['check']}{' #' + str(c['trial']) if 'trial' in c else ''} | {c['rel_err']:.2e} | "
                  + (f"info: argmax agrees on {c['argmax_agree']:.0%} |" if c.get("info_only") else
                     f"{'yes' if c['ok'] else '**NO**'} |") for c in checks]
        lines.append("")
    if isinstance(r.get("prefill"), list):
        lines += ["## Prefill, llama3_8b_shape (bf16, random weights), one sequence", "",
                  "| tokens | naive ms | flash ms | speed-up | naive peak +GiB | flash peak +GiB |",
                  "|---|---|---|---|---|---|"]
        by = {(x["tokens"], x["attention"].startswith("sdpa")): x for x in r["prefill"]}
        for t in (512, 2048, 4096):
            n, f = by.get((t, False)), by.get((t, True))
            if n and f:
                lines.append(f"| {t} | {n['ms']:.1f} | {f['ms']:.1f} | {n['ms'] / f['ms']:.2f}× | "
                             f"{n['peak_extra_gib']:.2f} | {f['peak_extra_gib']:.2f} |")
        lines.append("")
    if isinstance(r.get("decode"), list):
        lines += ["## Decode step, llama3_8b_shape (bf16, random weights, flash_attn on, 1024-token contexts)", "",
                  "step = ModelRunner.forward wall time (host input prep + launch or replay, synchronized); "
                  "gpu = device time of the forward or graph replay alone; floor = (weights + KV read once) / "
                  "copy bandwidth.", "",
                  "| variant | batch | step ms | gpu ms | floor ms | step / floor | gpu / floor | tok/s |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {x['variant']} | {x['batch']} | {x['step_ms']:.2f} | {x['gpu_ms']:.2f} | {x['floor_ms']:.2f} | "
                  f"{x['step_over_floor']:.2f}× | {x['gpu_over_floor']:.2f}× | {x['tok_s']:.0f} |" for x in r["decode"]]
        lines.append("")
    sm = r.get("smollm2")
    if isinstance(sm, dict) and "rows" in sm:
        lines += [f"## Greedy outputs, {sm['model']}, {sm['prompts']} builtin prompts, ≤ {sm['max_tokens']} "
                  f"tokens, vs {sm['compared_to']}", "",
                  "| config | identical to bf16 baseline | first divergence (token positions) | identical to float32 |",
                  "|---|---|---|---|"]
        lines += [f"| {x['config']} | {x['identical']}/{x['prompts']} | "
                  f"{', '.join(map(str, x['first_divergence_positions'])) or '-'} | "
                  f"{x.get('identical_to_float32', '?')}/{x['prompts']} |" for x in sm["rows"]]
        lines.append("")
    errs = [k for k, v in r.items() if isinstance(v, dict) and "error" in v]
    if errs:
        lines += ["## Sections that failed", ""] + [f"- {k}: {r[k]['error']}" for k in errs]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smollm2-cache", default=None, help="cache_dir holding (or to hold) SmolLM2's conversion")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    random.seed(0)
    RESULTS["environment"] = environment(" ".join(sys.argv))
    log(RESULTS["environment"])
    section("bandwidth", out)(copy_bandwidth)
    for name, fn in (("check_paged_decode", check_paged_decode), ("check_fused", check_fused),
                     ("check_prefill", check_prefill)):
        if name not in skip:
            section(name, out)(fn)
    model = load_model(LLAMA8B, DEV, BF16, seed=0)
    RESULTS["llama3_8b_shape"] = {"params": sum(p.numel() for p in model.parameters()),
                                  "weights_read_per_decode_step_bytes": weights_read_bytes(model),
                                  "kv_bytes_per_token": kv_bytes_per_token(model, BF16)}
    if "check_decode_step" not in skip:
        section("check_decode_step", out)(lambda: decode_step_equivalence(model))
    if "prefill" not in skip:
        section("prefill", out)(lambda: prefill_bench(model))
    bw = RESULTS["bandwidth"].get("tb_s", 4.3)
    if "decode" not in skip:
        section("decode", out)(lambda: decode_bench(model, bw))
    del model
    torch.cuda.empty_cache()
    if args.smollm2_cache and "smollm2" not in skip:
        section("smollm2", out)(lambda: smollm2_greedy(args.smollm2_cache))
    md = markdown()
    (out / "gpu_bench.md").write_text(md)
    save(out)
    log(md)


if __name__ == "__main__":
    main()
