"""Quantization on one GPU, in one run (benchmarks/gpu_quant.sh on the H200; results under --out):

1. kernels against float64: the weight-quantized skinny GEMM of optladder/engine/kernels/wq_gemv.py (int8 and fp8
   weights, Llama-3-8B's decode shapes) and the fp8 prefill product (torch._scaled_mm, per-token scales);
2. llama3_8b_shape (random bf16 weights), the engine's decode setting (paged KV, flash attention, continuous
   batching, CUDA graphs): decode ms per step at batch 1, 8 and 32 for bf16, quant_fp8 and quant_int8
   weights, each with the KV cache in bf16 and in fp8 (kv_fp8), against the floor of reading the weights
   and the KV once at the measured copy bandwidth; KV bytes per token and the most 2048-token sequences
   the block manager admits at one KV budget;
3. SmolLM2 (bf16 control): the teacher-forced measures of quant_fp8, quant_int8 and kv_fp8 on the builtin
   prompts, with intervals and the gates' verdicts, and the share of greedy answers identical to the control's.
    python benchmarks/gpu_quant.py --out DIR [--smollm2-cache DIR]
    python benchmarks/gpu_quant.py --cpu --out DIR [--candidates ...]    (what a CPU runs: 1 and 3, no fp8 weights)
On a CPU (float32 control) section 3 is also the calibration of the gates: --candidates
bfloat16,quant_int8,kv_fp8,zero_layer,round_bits_4,round_bits_3 (README).
Needs torch, triton, transformers, numpy and psutil: no Hydra, MLflow, sacrebleu or rouge-score.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

if "--cpu" in sys.argv:  # the Triton kernels on CPU tensors: the interpreter, chosen before Triton loads
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optladder.abtest.gates import GateConfig  # noqa: E402
from optladder.abtest.teacher_forced import intervals, teacher_forced_checks  # noqa: E402
from optladder.backends.engines import ReferenceBackend  # noqa: E402
from optladder.engine.block_manager import BlockManager  # noqa: E402
from optladder.engine.config import EngineConfig, ModelConfig  # noqa: E402
from optladder.engine.llm_engine import LLMEngine  # noqa: E402
from optladder.engine.quant import dequantize_rows, quantize_rows, scaled_mm_fp8  # noqa: E402
from optladder.engine.sequence import SamplingParams, Sequence  # noqa: E402
from optladder.engine.tokenizer import chat_token_ids  # noqa: E402
from optladder.experiments.teacher_forced_run import score_pair  # noqa: E402
from optladder.quality.prompts import QualityConfig, load_prompt_set  # noqa: E402
from optladder.quality.teacher_forced import TokenLogprobs, to_metrics  # noqa: E402

LLAMA8B = ModelConfig(name="llama3_8b_shape", source="random", package=None, gguf_file=None, tokenizer="synthetic",
                      vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                      max_position_embeddings=8192, tie_word_embeddings=False)
# the decode setting of the engine; the decode-kernel switches where this engine has them as their own
DECODE_OPTS = {k: True for k in ("paged_kv", "flash_attn", "dynamic_batching", "batched_decode", "cuda_graphs",
                                 "fused_kernels", "skinny_gemm") if k in EngineConfig.__dataclass_fields__}
RESULTS: dict = {}
# candidate -> (engine fields, model fields) on top of the control
CANDIDATES = {"quant_fp8": ({"quant_fp8": True}, {}), "quant_int8": ({"quant_int8": True}, {}),
              "kv_fp8": ({"kv_fp8": True}, {}), "bfloat16": ({"dtype": "bfloat16"}, {}),
              "zero_layer": ({}, {"damage": "zero_layer:15"}), "round_bits_4": ({}, {"damage": "round_bits:4"}),
              "round_bits_3": ({}, {"damage": "round_bits:3"})}


def log(*a) -> None:
    print(*a, flush=True)


def section(name: str, out: Path, fn, *args) -> None:
    """Run one section; a failure is recorded and the next section still runs."""
    t0 = time.perf_counter()
    try:
        RESULTS[name] = fn(*args)
    except Exception as e:  # noqa: BLE001 - the run must go on and report what failed
        RESULTS[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        log(f"!! {name} failed: {e}")
    RESULTS.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
    (out / "gpu_quant.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def environment(device: torch.device) -> dict:
    import transformers

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
           "python": platform.python_version(), "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, capability=list(torch.cuda.get_device_capability(device)), sms=p.multi_processor_count)
    return env


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float("inf") if not torch.isfinite(out).all() else ((out.double() - ref).norm() / ref.norm()).item()


# --- 1. kernels ---

def kernel_checks(device: torch.device) -> list[dict]:
    from optladder.engine.kernels.wq_gemv import wq_linear

    rows, gen = [], torch.Generator(device=device).manual_seed(0)
    shapes = ((6144, 4096), (4096, 4096), (2 * 14336, 4096), (4096, 14336), (960, 576))
    for method in ("int8", "fp8"):
        for n, k in ((960, 576), (200, 320)) if device.type == "cpu" else shapes:  # the interpreter is slow
            q, s = quantize_rows(torch.randn(n, k, device=device, generator=gen) * 0.02, method)
            w = dequantize_rows(q, s, torch.float64)
            for m, kernel in ((1, "row"), (1, "dot"), (8, "auto"), (16, "auto"), (32, "auto"), (64, "auto")):
                x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
                err = rel_error(wq_linear(x, q, s, kernel=kernel), x.double() @ w.t())
                rows.append({"check": f"wq_gemv {method} {kernel} M={m} N={n} K={k}", "rel_err": err,
                             "ok": err <= 1e-2})
            for m in (64, 512):  # the fp8 prefill path; its activations are rounded to E4M3 too
                if method == "fp8":
                    x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
                    err = rel_error(scaled_mm_fp8(x, q, s), x.double() @ w.t())
                    rows.append({"check": f"scaled_mm fp8 M={m} N={n} K={k} (activations in E4M3)",
                                 "rel_err": err, "ok": err <= 6e-2})
    for r in rows:
        log(f"{r['check']:60s} rel_err {r['rel_err']:.2e} {'ok' if r['ok'] else 'FAIL'}")
    return rows


L2_FLUSH_BYTES = 256 << 20  # H200 L2: 50 MB; each timed call reads a weight copy not read in the last 200+ MB


def kernel_speed() -> list[dict]:
    """Each Llama-3-8B decode shape alone: bf16 F.linear (cuBLAS) against the one-byte weight kernels at
    M = 1 (the one-row kernel and the dot kernel, each autotuned) and M = 32, as the weight bytes read per
    second (GB/s). Each call reads the next of several copies of its weight (at least L2_FLUSH_BYTES in all),
    so no call finds its weight in the 50 MB L2, as in a decode step that reads every layer once."""
    from optladder.engine.kernels.wq_gemv import wq_linear

    def timed(fn, copies: int) -> float:
        """50 calls captured in one CUDA graph (no Python launch cost, as in the engine's graph-replayed
        decode), call i on weight copy i % copies, replayed 5 times: the median ms per call."""
        for i in range(3):
            fn(i % copies)  # autotuning and compilation, outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(50):
                fn(i % copies)
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 50)
        return statistics.median(times)  # ms

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for n, k in ((6144, 4096), (4096, 4096), (2 * 14336, 4096), (4096, 14336)):
        wb = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16) * 0.02
        for m in (1, 32):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            nb = -(-L2_FLUSH_BYTES // (n * k * 2))
            wbs = [wb.clone() for _ in range(nb)]
            ms = timed(lambda i: torch.nn.functional.linear(x, wbs[i]), nb)
            rows.append({"shape": f"{n}x{k}", "M": m, "kernel": "bf16 F.linear", "us": ms * 1e3,
                         "gb_s": n * k * 2 / ms / 1e6, "weight_copies": nb})
            wbs = []  # free the copies before the next allocation
            for method in ("fp8", "int8"):
                q, sc = quantize_rows(wb, method)
                nq = -(-L2_FLUSH_BYTES // (n * k))
                qs = [(q.clone(), sc.clone()) for _ in range(nq)]
                for kernel in (("row", "dot") if m == 1 else ("dot",)):
                    ms = timed(lambda i: wq_linear(x, qs[i][0], qs[i][1], kernel=kernel), nq)
                    rows.append({"shape": f"{n}x{k}", "M": m, "kernel": f"{method} {kernel}", "us": ms * 1e3,
                                 "gb_s": (n * k + 4 * n) / ms / 1e6, "weight_copies": nq})
                qs = []
        del wb
        torch.cuda.empty_cache()
    for r in rows:
        log(f"kernel {r['shape']:>11s} M={r['M']:2d} {r['kernel']:14s} {r['us']:8.1f} us {r['gb_s']:7.0f} GB/s "
            f"({r['weight_copies']} copies)")
    return rows


# --- 2. llama3_8b_shape: decode speed and KV capacity ---

def weights_read_bytes(model) -> int:
    """What a decode step reads: every weight once (quantized ones as stored), the embedding table aside."""
    emb = model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters() if p is not emb)
    quant = [b for n, b in model.named_buffers() if n.endswith(("qweight", "scales"))]
    return total + sum(b.numel() * b.element_size() for b in quant)


def copy_bandwidth_tb_s() -> float:
    n = 4 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / statistics.median(times) / 1e12


def timed_generate(engine: LLMEngine, batch: int, prompt_len: int, max_tokens: int) -> float:
    prompts = [[3 + (7 * i + j) % 50000 for j in range(prompt_len)] for i in range(batch)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def admitted(engine: LLMEngine, seq_len: int) -> int:
    """How many sequences of seq_len tokens the engine's own block manager admits at its KV budget."""
    bm = BlockManager(engine.block_manager.num_blocks, engine.block_size)
    n = 0
    while bm.can_allocate(seq := Sequence(f"a{n}", [1] * seq_len, SamplingParams())):
        bm.allocate(seq)
        n += 1
    return n


def decode_speed(bw: float, prompt_len: int = 512, steps: int = 128, kv_gb: float = 8.0) -> list[dict]:
    rows = []
    variants = [("bf16", {}), ("quant_fp8", {"quant_fp8": True}), ("quant_int8", {"quant_int8": True}),
                ("bf16 + kv_fp8", {"kv_fp8": True}), ("quant_fp8 + kv_fp8", {"quant_fp8": True, "kv_fp8": True})]
    for label, opts in variants:
        cfg = EngineConfig(device="cuda", dtype="bfloat16", max_model_len=2048, kv_cache_gb=kv_gb, max_num_seqs=32,
                           max_num_batched_tokens=32 * prompt_len, **DECODE_OPTS, **opts)
        engine = LLMEngine(LLAMA8B, cfg)
        w_bytes = weights_read_bytes(engine.model)
        for batch in (1, 8, 32):
            timed_generate(engine, batch, prompt_len, 4)  # warm-up
            runs = [(timed_generate(engine, batch, prompt_len, steps + 1)
                     - timed_generate(engine, batch, prompt_len, 1)) / steps * 1000 for _ in range(3)]
            ms = statistics.median(runs)
            kv_read = batch * (prompt_len + steps / 2) * engine.bytes_per_token
            floor = (w_bytes + kv_read) / (bw * 1e12) * 1000
            rows.append({"variant": label, "batch": batch, "step_ms": ms, "floor_ms": floor, "over_floor": ms / floor,
                         "tok_s": batch / ms * 1000, "weight_bytes_read": w_bytes,
                         "kv_bytes_per_token": engine.bytes_per_token, "runs_ms": runs})
            log(f"decode {label:22s} B={batch:2d} {ms:7.2f} ms/step  floor {floor:6.2f} ms  {ms / floor:.2f}x")
        eff = engine.opts_effective()
        rows.append({"variant": label, "kv_cache_gb": kv_gb, "kv_bytes_per_token": engine.bytes_per_token,
                     "admitted_2048": admitted(engine, 2048), "weight_bytes_read": w_bytes,
                     "quant": {k: eff[k] for k in ("quant_fp8", "quant_int8", "kv_fp8") if k in eff},
                     "attention": eff["flash_attn"]["backend"]})
        del engine
        torch.cuda.empty_cache()
    return rows


# --- 3. SmolLM2 quality ---

class TopKOnly:
    """A backend that hands out only its top-k log-probs, as vLLM does: to measure that approximation."""

    def __init__(self, backend, k: int = 20):
        self.backend, self.k, self.tokenizer = backend, k, backend.tokenizer

    def score(self, token_ids_list, starts):
        full = self.backend.score(token_ids_list, starts)
        return [TokenLogprobs(t.target, None, *t.topk(self.k)) for t in full]


def smollm2_quality(model_cfg: ModelConfig, device: str, num_prompts: int, candidates: list[str],
                    topk_check: bool = False, answers_too: bool = True) -> dict:
    base = dict(device=device, max_model_len=2048, kv_cache_gb=1.0, **({k: True for k in ("paged_kv", "flash_attn",
                "dynamic_batching", "batched_decode")} if device == "cuda" else {}))
    control = ReferenceBackend(model_cfg, EngineConfig(**base))
    items = load_prompt_set(QualityConfig(num_prompts=num_prompts), None)
    prompts = [chat_token_ids(control.tokenizer, it.chat()) for it in items]
    answers = control.generate(prompts, 64, progress=False)
    out = {"num_prompts": len(items), "control": {k: v for k, v in base.items() if k != "device"} | {
        "dtype": "bfloat16" if device == "cuda" else "float32"}}
    gate = GateConfig()
    for name in candidates:
        opts, model_opts = CANDIDATES[name]
        cand = ReferenceBackend(dataclasses.replace(model_cfg, **model_opts), EngineConfig(**{**base, **opts}))
        tf = score_pair(control, cand, items, answers, 2048, progress=False)
        same = sum(a == b for a, b in zip(answers, cand.generate(prompts, 64, progress=False))) if answers_too else None
        ivs = intervals(tf, gate.n_boot, gate.seed, gate.alpha)
        checks = teacher_forced_checks(tf, gate.teacher_forced_bounds(), gate.n_boot, gate.seed, gate.alpha,
                                       gate.min_pairs)
        status = ("fail" if any(c.status == "fail" for c in checks) else
                  "inconclusive" if any(c.status == "inconclusive" for c in checks) else "pass")
        out[name] = {"opts": {**opts, **model_opts}, "metrics": to_metrics(tf),
                     "intervals": {k: dataclasses.asdict(v) for k, v in ivs.items()},
                     "gates": [c._asdict() | {"interval": None} for c in checks], "verdict": status,
                     "exact_answers": same, "evidence": {k: v for k, v in cand.opts_effective().items() if k in opts}}
        log(f"SmolLM2 {name}: {status}; " + "; ".join(c.reason for c in checks))
        if topk_check:  # the same sequences with only top-20 log-probs from each arm, as from vLLM
            approx = to_metrics(score_pair(TopKOnly(control), TopKOnly(cand), items, answers, 2048, progress=False))
            out[name]["kl_mean_top20_over_exact"] = (approx["quality/kl_vs_control_mean"]
                                                     / out[name]["metrics"]["quality/kl_vs_control_mean"])
        cand.close()
    return out


def markdown(res: dict) -> str:
    env = res.get("environment", {})
    lines = [f"# Quantization on {env.get('gpu', 'a CPU')}", "", f"torch {env.get('torch')}, CUDA {env.get('cuda')}, "
             f"{env.get('date_utc')} UTC; copy bandwidth {res.get('bandwidth_tb_s', float('nan')):.2f} TB/s", ""]
    checks = res.get("kernels")
    if isinstance(checks, list):
        worst = max(checks, key=lambda r: r["rel_err"] / (1e-2 if "wq_gemv" in r["check"] else 6e-2))
        lines += [f"Kernels against float64: {sum(r['ok'] for r in checks)} of {len(checks)} checks within tolerance; "
                  f"worst {worst['check']}: {worst['rel_err']:.2e}.", ""]
    ks = res.get("kernel_speed")
    if isinstance(ks, list):
        lines += ["One linear layer of Llama-3-8B's decode step alone (weight bytes read per second):", "",
                  "| shape N x K | M | kernel | us | GB/s |", "|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['M']} | {r['kernel']} | {r['us']:.1f} | {r['gb_s']:.0f} |" for r in ks]
        lines += [""]
    speed = res.get("decode_llama3_8b_shape")
    if isinstance(speed, list):
        lines += ["| weights / KV | batch | ms per step | floor ms | / floor | tok/s |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['batch']} | {r['step_ms']:.2f} | {r['floor_ms']:.2f} | "
                  f"{r['over_floor']:.2f} | {r['tok_s']:.0f} |" for r in speed if "batch" in r]
        lines += ["", "| weights / KV | weight bytes read | KV bytes per token | 2048-token sequences admitted |",
                  "|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['weight_bytes_read'] / 2**30:.2f} GiB | {r['kv_bytes_per_token']:,} | "
                  f"{r['admitted_2048']} at {r['kv_cache_gb']} GiB |" for r in speed if "admitted_2048" in r]
    q = res.get("smollm2_quality")
    if isinstance(q, dict) and "num_prompts" in q:
        head = f"SmolLM2-135M-Instruct, {q['num_prompts']} builtin prompts, control {q['control']['dtype']}:"
        lines += ["", head, "",
                  "| candidate | verdict | KL mean | KL p99 | top-1 agree | ref ppl change | answers identical |",
                  "|---|---|---|---|---|---|---|"]
        for name, r in q.items():
            if isinstance(r, dict) and "verdict" in r:
                iv = r["intervals"]
                cell = lambda m, f: (f"{f(iv[m]['estimate'])} [{f(iv[m]['low'])}, {f(iv[m]['high'])}]"  # noqa: E731
                                     if m in iv else "-")
                num, pct = (lambda x: f"{x:.4f}"), (lambda x: f"{x:.2%}")
                lines.append(f"| {name} | {r['verdict']} | {cell('quality/kl_vs_control_mean', num)} | "
                             f"{cell('quality/kl_vs_control_p99', num)} | "
                             f"{cell('quality/top1_agree_vs_control', pct)} | "
                             f"{cell('quality/ppl_ref_rel_change', pct)} | "
                             f"{'-' if r['exact_answers'] is None else r['exact_answers']}/{q['num_prompts']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smollm2-cache", default=None, help="the converted SmolLM2 folder's parent (model.cache_dir)")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--cpu", action="store_true", help="only what a CPU can run: kernels (interpreter), int8 quality")
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--kernel-speed-only", action="store_true", help="only the one-layer kernel timings")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (a shared CPU: 1)")
    ap.add_argument("--no-answers", action="store_true", help="skip each candidate's greedy answers (slow on a CPU)")
    ap.add_argument("--topk-check", action="store_true", help="also the KL from top-20 log-probs only, vs exact")
    ap.add_argument("--candidates", default=None, help=f"comma-separated, of {', '.join(CANDIDATES)} "
                    "(default: quant_fp8,quant_int8,kv_fp8; on a CPU quant_int8,kv_fp8)")
    args = ap.parse_args()
    default = "quant_int8,kv_fp8" if args.cpu else "quant_fp8,quant_int8,kv_fp8"
    args.candidates = (args.candidates or default).split(",")
    bad = [c for c in args.candidates if c not in CANDIDATES]
    if bad:  # before any work
        ap.error(f"--candidates {bad}: valid: {', '.join(CANDIDATES)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.cpu else "cuda")
    RESULTS["environment"] = environment(device) | {"command": " ".join(sys.argv)}
    if args.kernel_speed_only:
        section("kernel_speed", args.out, kernel_speed)
    else:
        run_all(args, device)
    from optladder.engine.kernels.wq_gemv import chosen_configs

    RESULTS["wq_gemv_configs"] = chosen_configs()
    (args.out / "gpu_quant.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    (args.out / "gpu_quant.md").write_text(markdown(RESULTS))
    log((args.out / "gpu_quant.md").read_text())


def run_all(args, device: torch.device) -> None:
    section("kernels", args.out, kernel_checks, device)
    if not args.cpu and not args.skip_8b:
        RESULTS["bandwidth_tb_s"] = copy_bandwidth_tb_s()
        section("kernel_speed", args.out, kernel_speed)
        section("decode_llama3_8b_shape", args.out, decode_speed, RESULTS["bandwidth_tb_s"])
    if not args.skip_smollm2:
        section("smollm2_quality", args.out, smollm2_quality, ModelConfig(cache_dir=args.smollm2_cache), device.type,
                args.num_prompts, args.candidates, args.topk_check, not args.no_answers)


if __name__ == "__main__":
    main()
