"""Speculative decoding on one GPU, in one run (benchmarks/gpu_spec.sh on the H200; results under --out):

1. SmolLM2-135M-Instruct in bf16, every decode switch on (paged_kv, flash_attn, dynamic_batching,
   batched_decode, cuda_graphs): batch-1 decode ms per token without speculation, with `ngram` and with
   `draft_layers`, side by side prompt by prompt (benchmarks/cpu_spec.py's protocol), on the repeat-heavy set
   (benchmarks/data/rewrite_prompts.jsonl) and the built-in quality set; acceptance, tokens per verification,
   and how many outputs equal the baseline arm's (bf16: a k + 1-row verification step sums in another order
   than a one-row step, so a near tie can flip; the CPU float32 run is the exactness check).
2. Llama-3-8B's shape (random bf16 weights, 49,152-token vocabulary) under the Azure replay of
   benchmarks/gpu_serving_vs_vllm.py (the same request list, seeded token ids, EOS ignored) at time scales
   1 and 4, the engine of that protocol (chunked prefill included) without and then with `ngram`
   speculation: throughput, TTFT/TPOT/E2E p50/p99 and the acceptance. Random weights make the
   acceptance a property of a random model (it repeats itself), not of text: the point is the cost of
   verifying drafts in a loaded step.

    python3 benchmarks/gpu_spec.py --out DIR --requests .stage/azure500.json [--smollm2-cache DIR]
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import cpu_spec  # noqa: E402
import gpu_serving_vs_vllm as serving  # noqa: E402
from optladder.engine.config import EngineConfig, ModelConfig, SpeculativeConfig  # noqa: E402
from optladder.engine.llm_engine import LLMEngine  # noqa: E402
from optladder.engine.sequence import SamplingParams  # noqa: E402
from optladder.engine.tokenizer import chat_token_ids  # noqa: E402
from optladder.quality.prompts import QualityConfig, load_prompt_set  # noqa: E402
from optladder.quality.user_sets import read_user_set  # noqa: E402


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def smollm2_batch1(args, device: str) -> dict:
    cuda = device == "cuda"
    base = dict(device=device, dtype="bfloat16" if cuda else "float32", max_model_len=2048, kv_cache_gb=1.0,
                paged_kv=True, flash_attn=True, dynamic_batching=True, batched_decode=True, cuda_graphs=cuda)
    k = args.num_draft_tokens
    configs = cpu_spec.spec_arms(k, args.draft_layers)
    mcfg = ModelConfig(cache_dir=args.smollm2_cache)
    engines = {name: LLMEngine(mcfg, EngineConfig(**base, **kw)) for name, kw in configs.items()}
    tok = next(iter(engines.values())).tokenizer
    sets = {"repeat-heavy set (rewrite / fix / reformat)": read_user_set(cpu_spec.REWRITE)[0][:args.prompts],
            "built-in quality set": load_prompt_set(QualityConfig(num_prompts=args.prompts), None)}
    warm = chat_token_ids(tok, sets["built-in quality set"][0].chat())
    for e in engines.values():  # graphs captured, kernels compiled, before any timing
        cpu_spec.one_request(e, warm, 16)
    res: dict = {"settings": {k2: v for k2, v in base.items()}, "tables": [], "sets": {}}
    for label, items in sets.items():
        arms = [cpu_spec.Arm(name, engines[name].cfg) for name in configs]
        prompts = [chat_token_ids(tok, it.chat()) for it in items]
        cpu_spec.run_set(arms, engines, prompts, args.max_new_tokens, label)
        res["tables"] += cpu_spec.table(arms, label, len(prompts))
        res["sets"][label] = {a.name: {"decode_ms_per_token": 1000 * a.decode_s / max(1, a.decode_tokens),
                                       "output_tokens": a.decode_tokens + len(prompts),
                                       "exact_vs_baseline": sum(x == y for x, y in zip(a.outputs, arms[0].outputs)),
                                       "evidence": a.evidence} for a in arms}
    engines.clear()
    return res


def azure_replay(args, save) -> dict:
    serving.NUM_REQUESTS = args.num_requests
    reqs = serving.load_requests(args.requests)
    out: dict = {"num_requests": len(reqs), "settings": dict(serving.SETTINGS), "opts": list(serving.OUR_OPTS),
                 "runs": []}
    arms = (("no speculation", None),
            (f"ngram (k={args.num_draft_tokens})", SpeculativeConfig("ngram", num_draft_tokens=args.num_draft_tokens)))
    for arm, sp in arms:  # one engine on the GPU at a time: this arm's scales, then it goes
        engine = _engine(sp)
        # warm-up before any timing (kernels compiled, graphs captured), as the serving protocol's b1 runs do
        engine.generate(serving.prompts(99, 4, 512 if not serving.TINY else 32),
                        SamplingParams(max_tokens=16, ignore_eos=True))
        for scale in args.scales:
            for rep in range(args.repeats):
                log(f"replay {arm} at {scale}x, repeat {rep + 1}")
                r = serving.replay_ours(engine, reqs, scale)
                r["speculative"] = engine.opts_effective()["speculative"]
                out["runs"].append({"arm": arm, "scale": scale, "repeat": rep, **r})
                save(out)
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def _engine(sp: SpeculativeConfig | None) -> LLMEngine:
    """benchmarks/gpu_serving_vs_vllm.py's engine (every GPU switch, chunked prefill included), plus `sp`."""
    mcfg = ModelConfig(name="llama3_8b_shape_v49k", source="random", package=None, gguf_file=None,
                       tokenizer="synthetic", tie_word_embeddings=False, **serving.SHAPE)
    tiny = serving.TINY  # GPU_SERVING_TINY=1: a 2-layer shape on the CPU checks this script's logic only
    opts = {o: True for o in serving.OUR_OPTS if not (tiny and o in ("cuda_graphs", "fused_kernels", "skinny_gemm"))}
    ecfg = EngineConfig(dtype="float32" if tiny else "bfloat16", device="cpu" if tiny else "cuda", max_model_len=serving.SETTINGS["max_model_len"],
                        kv_cache_gb=serving.SETTINGS["kv_gib"], max_num_seqs=serving.SETTINGS["max_num_seqs"],
                        batch_size=serving.SETTINGS["max_num_seqs"],
                        max_num_batched_tokens=serving.SETTINGS["max_num_batched_tokens"],
                        **({"speculative": sp} if sp is not None else {}), **opts)
    return LLMEngine(mcfg, ecfg)


def markdown(res: dict) -> str:
    env = res.get("environment", {})
    lines = ["# Speculative decoding on the GPU", "",
             f"- {env.get('gpu')}, torch {env.get('torch')}, Python {env.get('python')}",
             f"- command: `{env.get('command')}`", ""]
    if "smollm2" in res:
        s = res["smollm2"]
        lines += [f"## SmolLM2-135M-Instruct, {s['settings']['dtype']}, batch 1", "",
                  f"settings: {s['settings']}; greedy, stop at EOS, at most {res['args']['max_new_tokens']} tokens, "
                  "chat template; every arm on the same prompt in turn", ""] + s["tables"]
    elif "smollm2_error" in res:
        lines += ["## SmolLM2: not run", "", "```", res["smollm2_error"][-1500:], "```", ""]
    if "replay" in res:
        rp = res["replay"]
        lines += ["## Llama-3-8B's shape, Azure replay, with and without ngram speculation", "",
                  f"{rp['num_requests']} requests of the trace's head; engine: {', '.join(rp['opts'])}; {rp['settings']}",
                  "", "| arm | scale | out tok/s | TTFT p50/p99 ms | TPOT p50/p99 ms | E2E p99 s | acceptance | "
                  "tokens/verification |", "|---|---|---|---|---|---|---|---|"]
        for r in rp["runs"]:
            ev = r.get("speculative", {})
            acc = f"{ev['acceptance_rate']:.2f}" if ev.get("on") else "-"
            tpv = f"{ev['tokens_per_verification']:.2f}" if ev.get("on") else "-"
            lines.append(f"| {r['arm']} | {r['scale']}x | {r['out_tok_s']} | {r['ttft_ms_p50']} / {r['ttft_ms_p99']} | "
                         f"{r['tpot_ms_p50']} / {r['tpot_ms_p99']} | {r['e2e_ms_p99'] / 1e3:.2f} | {acc} | {tpv} |")
        lines.append("")
    elif "replay_error" in res:
        lines += ["## Replay: not run", "", "```", res["replay_error"][-1500:], "```", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=Path, default=ROOT / ".stage" / "azure500.json")
    ap.add_argument("--smollm2-cache", default=None)
    ap.add_argument("--prompts", type=int, default=20, help="per prompt set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 4.0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict = {"args": vars(args), "environment": {
        "python": platform.python_version(), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor(),
        "command": "python3 " + " ".join(sys.argv)}}
    save = lambda: ((args.out / "gpu_spec.json").write_text(json.dumps(res, indent=1, default=str)),  # noqa: E731
                    (args.out / "gpu_spec.md").write_text(markdown(res)))
    if not args.skip_smollm2:
        try:
            log("SmolLM2 batch 1")
            res["smollm2"] = smollm2_batch1(args, args.device)
        except Exception:  # noqa: BLE001  (the other section still runs)
            res["smollm2_error"] = traceback.format_exc()
            log(res["smollm2_error"])
        gc.collect()
        save()
    if not args.skip_replay and (args.device == "cuda" or serving.TINY):
        try:
            res["replay"] = azure_replay(args, lambda rp: (res.__setitem__("replay", rp), save()))
        except Exception:  # noqa: BLE001
            res["replay_error"] = traceback.format_exc()
            log(res["replay_error"])
        save()
    save()
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
