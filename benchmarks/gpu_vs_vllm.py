"""The reference engine with every GPU switch on against vLLM, side by side on one GPU, in one run.

Both engines get the same model shape (Llama-3-8B's layers with SmolLM2's 49,152-token vocabulary, random
bf16 weights: vLLM's `load_format="dummy"`, our `source=random`), the same token ids (seeded), the same
exact output lengths (ignore EOS, greedy) and the same cap of 64 sequences in flight. Each engine runs in
its own child process, one after the other, so neither sees the other's memory.

- batch-1 decode: one 256-token prompt; ms per output token = (time for 256 tokens − time for 1) / 255,
  the median of 3, so prefill and start-up cancel out;
- throughput: 64 prompts of 1,000 tokens, 128 output tokens each, all submitted at once;
- a smaller batch: 8 prompts of 512 tokens, 256 output tokens each.

    python3 benchmarks/gpu_vs_vllm.py --out $OUT --tok-dir DIR   (DIR: SmolLM2's tokenizer files, for vLLM)

vLLM comes from the trimmed 0.26.0 bundle of ../shared/tools/vllm-gpu (see benchmarks/gpu_vs_vllm.sh);
without it the vLLM column says why and ours still runs.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(vocab_size=49152, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
             max_position_embeddings=8192)
MAX_SEQS = 64
MAX_LEN = 2048
B1_PROMPT, B1_TOKENS, B1_REPEATS = 256, 256, 3
WORKLOADS = {"throughput_64x1000_128": (64, 1000, 128), "batch_8x512_256": (8, 512, 256)}
TINY = bool(os.environ.get("GPU_VS_VLLM_TINY"))  # a 2-layer shape on the CPU: checks this script's logic only
if TINY:
    SHAPE.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32)
    B1_PROMPT, B1_TOKENS, B1_REPEATS = 32, 16, 2
    WORKLOADS = {"throughput_64x1000_128": (4, 64, 8), "batch_8x512_256": (2, 32, 8)}


def prompts(seed: int, n: int, length: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, SHAPE["vocab_size"]) for _ in range(length)] for _ in range(n)]


def measure(generate, sync) -> dict:
    """generate(prompt_lists, max_tokens) -> output token counts; the same protocol for both engines."""
    res: dict = {}
    generate(prompts(99, 4, WORKLOADS["throughput_64x1000_128"][1]), 16)
    generate(prompts(98, 1, B1_PROMPT), 16)
    sync()
    t_full, t_one = [], []
    for r in range(B1_REPEATS):
        for n, acc in ((B1_TOKENS, t_full), (1, t_one)):
            b1 = prompts(1000 * n + r, 1, B1_PROMPT)  # a fresh prompt every time: no cache can serve it
            t = time.perf_counter()
            got = generate(b1, n)
            sync()
            acc.append(time.perf_counter() - t)
            assert got == [n], f"asked for {n} tokens, got {got}"
    full, one = statistics.median(t_full), statistics.median(t_one)
    res["decode_b1"] = dict(prompt_tokens=B1_PROMPT, output_tokens=B1_TOKENS, ttft_ms=round(one * 1e3, 2),
                            total_ms=round(full * 1e3, 1),
                            ms_per_token=round((full - one) * 1e3 / (B1_TOKENS - 1), 3),
                            runs_full_s=[round(x, 4) for x in t_full], runs_one_s=[round(x, 4) for x in t_one])
    for i, (name, (n, plen, out)) in enumerate(WORKLOADS.items()):
        ps = prompts(10 + i, n, plen)
        t = time.perf_counter()
        got = generate(ps, out)
        sync()
        el = time.perf_counter() - t
        assert got == [out] * n, f"{name}: output lengths {sorted(set(got))}, asked for {out}"
        res[name] = dict(prompts=n, prompt_tokens=plen, output_tokens=out, elapsed_s=round(el, 3),
                         output_tok_s=round(n * out / el, 1))
    return res


def worker_ours() -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from optladder.engine.config import EngineConfig, ModelConfig
    from optladder.engine.llm_engine import LLMEngine
    from optladder.engine.sequence import SamplingParams

    mcfg = ModelConfig(name="llama3_8b_shape_v49k", source="random", package=None, gguf_file=None,
                       tokenizer="synthetic", tie_word_embeddings=False, **SHAPE)
    ecfg = EngineConfig(dtype="float32" if TINY else "bfloat16", device="cpu" if TINY else "cuda",
                        max_model_len=MAX_LEN, kv_cache_gb=0.1 if TINY else 24.0,
                        max_num_seqs=MAX_SEQS, max_num_batched_tokens=8192, batch_size=MAX_SEQS,
                        paged_kv=True, flash_attn=True, dynamic_batching=True, batched_decode=True,
                        cuda_graphs=not TINY)
    t = time.perf_counter()
    engine = LLMEngine(mcfg, ecfg)
    sync = (lambda: None) if TINY else torch.cuda.synchronize
    sync()
    init_s = time.perf_counter() - t

    def generate(ps, n):
        seqs = engine.generate(ps, SamplingParams(max_tokens=n, ignore_eos=True))
        return [s.num_output_tokens for s in seqs]

    res = measure(generate, sync)
    res.update(engine="reference (optladder)", init_s=round(init_s, 1), opts=engine.enabled_opts,
               opts_effective=engine.opts_effective(), torch=torch.__version__)
    if not TINY:
        res.update(gpu=torch.cuda.get_device_name(0),
                   peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))
    return res


def worker_vllm(tok_dir: str) -> dict:
    from gpubench.vllm_model import offline_env, random_llama_dir

    offline_env()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model_dir = random_llama_dir(Path("/tmp/gpu_vs_vllm_model"), SHAPE, tok_dir)
    t = time.perf_counter()
    extra = dict(kv_cache_memory_bytes=1 << 30, enforce_eager=True) if TINY else dict(gpu_memory_utilization=0.5)
    llm = LLM(model=str(model_dir), load_format="dummy", dtype="bfloat16", max_model_len=MAX_LEN,
              max_num_seqs=MAX_SEQS, enable_prefix_caching=False, seed=0, **extra)
    init_s = time.perf_counter() - t

    def generate(ps, n):
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps],
                            SamplingParams(max_tokens=n, ignore_eos=True, temperature=0), use_tqdm=False)
        return [len(o.outputs[0].token_ids) for o in outs]

    try:
        res = measure(generate, lambda: None)
        res.update(engine=f"vLLM {vllm.__version__}", init_s=round(init_s, 1),
                   settings="its defaults (torch.compile + CUDA graphs, chunked prefill, FlashAttention 3 on "
                            "Hopper), prefix caching off as in ours")
    finally:
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()  # its engine process holds the GPU memory
    return res


def run_worker(which: str, args, out: Path) -> dict:
    path = out / f"gpu_vs_vllm_{which}.json"
    path.unlink(missing_ok=True)  # only this run's results count
    cmd = [sys.executable, __file__, "--worker", which, "--json", str(path), "--tok-dir", args.tok_dir or ""]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, timeout=args.timeout, capture_output=True)
        out_b, err_b, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:  # its stdout/stderr are bytes, whatever text= says
        out_b, err_b, rc = e.stdout or b"", e.stderr or b"", "timeout"
    log = (out_b + err_b).decode(errors="replace")
    (out / f"gpu_vs_vllm_{which}.log").write_text(log)
    print(f"{which}: exit {rc} after {time.perf_counter() - t:.0f} s", flush=True)
    if path.exists():
        return json.loads(path.read_text())
    return {"error": f"exit {rc}", "log_tail": log[-1500:]}


def table(ours: dict, theirs: dict) -> str:
    def cell(d, *keys):
        for k in keys:
            d = d.get(k, {}) if isinstance(d, dict) else {}
        return d if isinstance(d, (int, float)) else None

    rows = [("batch-1 decode, ms per output token (lower is better)", ("decode_b1", "ms_per_token")),
            (f"batch-1 time to first token, {B1_PROMPT}-token prompt, ms", ("decode_b1", "ttft_ms"))]
    rows += [(f"{n} prompts × {p} tokens → {o} out: output tok/s (higher is better)", (k, "output_tok_s"))
             for k, (n, p, o) in WORKLOADS.items()]
    lines = ["| measure | optladder reference engine | vLLM | optladder / vLLM |", "|---|---|---|---|"]
    for label, keys in rows:
        a, b = cell(ours, *keys), cell(theirs, *keys)
        ratio = f"{a / b:.2f}×" if a is not None and b else "-"
        lines.append(f"| {label} | {a if a is not None else '-'} | {b if b is not None else '-'} | {ratio} |")
    lines.append(f"| engine start (s): weights, KV pool, graph capture / compile | {ours.get('init_s', '-')} | "
                 f"{theirs.get('init_s', '-')} | - |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_out"))
    ap.add_argument("--tok-dir", default=None)
    ap.add_argument("--timeout", type=float, default=420)
    ap.add_argument("--only", choices=["ours", "vllm"], default=None)
    ap.add_argument("--worker", choices=["ours", "vllm"], default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.worker:
        res = worker_ours() if args.worker == "ours" else worker_vllm(args.tok_dir)
        args.json.write_text(json.dumps(res, indent=1, default=str))
        print(json.dumps(res, default=str), flush=True)
        sys.stdout.flush()
        os._exit(0)  # vLLM's engine process and its teardown: the results are written, leave now
    args.out.mkdir(parents=True, exist_ok=True)
    ours = run_worker("ours", args, args.out) if args.only in (None, "ours") else {}
    theirs = run_worker("vllm", args, args.out) if args.only in (None, "vllm") else {}
    md = ["# optladder's reference engine (all GPU switches on) vs vLLM, one GPU, one run", "",
          f"- command: `python3 benchmarks/gpu_vs_vllm.py --out $OUT --tok-dir DIR` "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
          f"- GPU: {ours.get('gpu', '?')}; torch {ours.get('torch', '?')}; {theirs.get('engine', 'vLLM: ' + str(theirs.get('error')))}",
          "- model: Llama-3-8B's shape (32 layers, 32 heads, 8 KV heads, head_dim 128, intermediate 14336) with a "
          "49,152-token vocabulary, random bf16 weights; identical token ids, exact output lengths (ignore EOS), "
          f"greedy; at most {MAX_SEQS} sequences in flight in both",
          f"- optladder: {', '.join(ours.get('opts', []))}; vLLM: {theirs.get('settings', '-')}", "",
          table(ours, theirs), ""]
    for name, d in (("ours", ours), ("vllm", theirs)):
        if "error" in d:
            md += [f"{name} failed: {d['error']}", "", "```", d.get("log_tail", ""), "```", ""]
    report = "\n".join(md)
    (args.out / "gpu_vs_vllm.md").write_text(report)
    (args.out / "gpu_vs_vllm.json").write_text(json.dumps({"optladder": ours, "vllm": theirs}, indent=1,
                                                          default=str))
    print(report)
    return 0 if "error" not in ours and "error" not in theirs else 1


if __name__ == "__main__":
    sys.exit(main())
