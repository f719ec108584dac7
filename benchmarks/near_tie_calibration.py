"""Calibrate the near-tie lossless check (optladder/quality/near_tie.py): each real lossless switch must pass it
and each planted bug (engine.debug_plant) must fail it, on the quality prompts, with the A/B configs' own arms.

For each case the two arms are the control and candidate of conf/ab/<switch>.yaml (a planted bug: that
switch's candidate with the bug added), built in this process one after the other, each generating the greedy
answers with their top-5 log-probs (generate_traced, the path an A/B takes); no replay. Prints a markdown table
and writes it, with every case's fork list, under --out.

    python benchmarks/near_tie_calibration.py --out /tmp/ntc -- model=smollm2_135m engine.dtype=bfloat16
    python benchmarks/near_tie_calibration.py --cases flash_attn,plant:stale_kv_slot:batched_decode -- model=tiny

A case is a switch name (conf/ab/NAME.yaml) or plant:BUG:SWITCH. Overrides after -- apply to both arms.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without an install

SWITCHES = ["paged_kv", "flash_attn", "dynamic_batching", "batched_decode", "chunked_prefill", "prefix_cache",
            "speculative"]
PLANTS = ["plant:kv_block_off_by_one:dynamic_batching", "plant:rope_off_by_one_chunk:chunked_prefill",
          "plant:stale_kv_slot:batched_decode"]
GPU_SWITCHES = ["cuda_graphs", "fused_kernels"]


def arms(case: str) -> tuple[list[str], list[str], bool]:
    """(control overrides, candidate overrides, expected to pass) of a case."""
    from omegaconf import OmegaConf

    from optladder.paths import CONF_DIR

    plant = None
    name = case
    if case.startswith("plant:"):
        _, plant, name = case.split(":")
    ab = OmegaConf.load(CONF_DIR / "ab" / f"{name}.yaml")
    control, candidate = list(ab.control), list(ab.candidate)
    if plant:
        candidate.append(f"engine.debug_plant={plant}")
    return control, candidate, plant is None


def traced(overrides: list[str], base: list[str]):
    from hydra import compose

    from optladder.backends import make_backend
    from optladder.experiments.build import build
    from optladder.experiments.experiment import TRACE_TOP_K
    from optladder.experiments.preflight import prepare

    conf = build(compose(config_name="config", overrides=[*base, *overrides]))
    prepared = prepare(conf)
    backend = make_backend(conf.model, conf.engine, "inprocess", conf.faults)
    try:
        t0 = time.perf_counter()
        _, traces, why = backend.generate_traced(prepared.prompt_ids, prepared.max_new_tokens, TRACE_TOP_K,
                                                 progress=False)
        return traces, why, [it.id for it in prepared.items], time.perf_counter() - t0
    finally:
        backend.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("near_tie_calibration"))
    ap.add_argument("--cases", default=",".join(SWITCHES + PLANTS),
                    help=f"comma-separated; default: {','.join(SWITCHES + PLANTS)}; on a GPU add "
                         f"{','.join(GPU_SWITCHES)}")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--margin", type=float, default=1.0)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    from hydra import initialize_config_dir

    from optladder.experiments.schema import register
    from optladder.paths import CONF_DIR
    from optladder.quality.near_tie import compare

    register()

    args.out.mkdir(parents=True, exist_ok=True)
    base = ["tracking=off", *args.overrides]
    rows, cache = [], {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for case in args.cases.split(","):
            control, candidate, expect_pass = arms(case)
            try:
                for o in (control, candidate):
                    if tuple(o) not in cache:
                        cache[tuple(o)] = traced(o, base)
            except Exception as e:  # a switch this machine cannot run: said, and the next case goes on
                print(f"{case}: not run: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            (ct, cwhy, ids, cs), (kt, kwhy, _, ks) = cache[tuple(control)], cache[tuple(candidate)]
            if cwhy or kwhy:
                print(f"{case}: no traces: {cwhy or kwhy}", flush=True)
                continue
            rep = compare(ct, kt, args.top_k, args.margin, ids)
            ok = not rep.offenders
            worst = rep.worst_margin
            row = {"case": case, "control": control, "candidate": candidate, "expect": "pass" if expect_pass else
                   "fail", "verdict": "pass" if ok else "fail", "prompts": rep.prompts, "equal": rep.equal,
                   "diverged": rep.diverged, "near_ties": rep.near_ties,
                   "worst_margin": worst if math.isfinite(worst) else None, "max_drift": rep.max_drift,
                   "seconds": [round(cs, 1), round(ks, 1)], "not_near_ties": [f.describe() for f in rep.offenders][:10],
                   "margins": sorted(round(f.margin, 4) for f in rep.forks if math.isfinite(f.margin))}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("not_near_ties", "margins")}), flush=True)
            (args.out / "cases.json").write_text(json.dumps(rows, indent=1))
    import torch

    head = (f"near-tie calibration: top-{args.top_k}, margin {args.margin:g} nats; overrides {' '.join(args.overrides)}"
            f"; torch {torch.__version__}, {platform.processor() or platform.machine()}"
            f"{', ' + torch.cuda.get_device_name() if torch.cuda.is_available() else ''}")
    lines = [head, "", "| case | expected | verdict | equal | diverged | near-ties | worst margin (nats) | "
             "max drift (nats) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        wm = "outside top-k" if r["worst_margin"] is None and r["diverged"] else f"{r['worst_margin'] or 0:.3f}"
        lines.append(f"| {r['case']} | {r['expect']} | {r['verdict']} | {r['equal']}/{r['prompts']} | "
                     f"{r['diverged']} | {r['near_ties']} | {wm} | {r['max_drift']:.3f} |")
    table = "\n".join(lines)
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    wrong = [r["case"] for r in rows if r["verdict"] != r["expect"]]
    print(f"cases against expectation: {wrong or 'none'}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
