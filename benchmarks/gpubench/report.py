"""The GPU bench's markdown report, from its results dict (gpu_bench.json): runs on any machine."""
from __future__ import annotations


def markdown(r: dict) -> str:
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
