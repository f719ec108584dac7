"""The capacity search with and without `replay.capacity_stop_early`, side by side on one engine in one process
(the rounds alternate the two; the machine is noisy, so compare within a round): the search's wall time, its
answer and each probe. Early stopping ends a probe once its P99 E2E must miss the SLO whatever its remaining
requests do (optladder/traffic/capacity.py stop_when_missed), so it may only shorten failing probes; the answers can still
differ where a probe near the threshold is noisy (a load that passes in one round and fails in the next).

    .venv/bin/python benchmarks/cpu_capacity_stop.py [--model smollm2_135m] [--slo 1.0] [--rounds 2]

The workload: random prompts of 16-199 tokens and outputs of 8-95 (exact lengths), 64 a probe (--requests),
closed loop between concurrency 1 and 64 (run.py's defaults).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optladder.engine.config import EngineConfig, ModelConfig  # noqa: E402
from optladder.engine.llm_engine import LLMEngine  # noqa: E402
from optladder.engine.sequence import SamplingParams  # noqa: E402
from optladder.traffic.capacity import find_capacity, requests_at, stop_when_missed  # noqa: E402
from optladder.traffic.metrics import SLO  # noqa: E402
from optladder.traffic.replay import InProcessDriver  # noqa: E402
from optladder.traffic.replay_config import Pacing, ReplayConfig  # noqa: E402
from optladder.traffic.request import Request  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--slo", type=float, default=1.0, help="P99 E2E SLO, seconds")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=64, help="a probe's requests (64, the top concurrency; fewer repeat the top loads)")
    ap.add_argument("--out", type=Path, default=None, help="write the rounds as JSON here")
    args = ap.parse_args()
    torch.manual_seed(0)
    mcfg = ModelConfig(**yaml.safe_load((ROOT / "optladder" / "conf" / "model" / f"{args.model}.yaml").read_text()))
    engine = LLMEngine(mcfg, EngineConfig(max_model_len=1024, kv_cache_gb=0.5, paged_kv=True, dynamic_batching=True,
                                          max_num_seqs=64))
    g = torch.Generator().manual_seed(1)
    # random prompts and outputs of exact lengths (ignore_eos)
    base = [Request(f"r{i}", torch.randint(100, 1000, (int(n),), generator=g).tolist(), int(o))
            for i, (n, o) in enumerate(zip(torch.randint(16, 200, (args.requests,), generator=g),
                                           torch.randint(8, 96, (args.requests,), generator=g)))]
    quiet = ReplayConfig(progress=False)

    def params(r: Request) -> SamplingParams:
        return SamplingParams(max_tokens=r.output_len, ignore_eos=True)

    def search(stop: bool):
        def run_at(load):
            reqs = requests_at(base, args.requests, load, "concurrency")
            cb = stop_when_missed(len(reqs), args.slo) if stop else None
            return InProcessDriver(engine, params, cb).replay(reqs, quiet, Pacing("closed", int(load)))
        t0 = time.perf_counter()
        res = find_capacity(run_at, 1, 64, SLO(e2e_s=args.slo), "concurrency", 6)
        return time.perf_counter() - t0, res

    search(False)  # warm-up: allocator, first-call costs
    rounds = []
    for i in range(args.rounds):
        for stop in ((True, False) if i % 2 == 0 else (False, True)):
            secs, res = search(stop)
            rounds.append({"round": i, "stop_early": stop, "search_s": round(secs, 2), "value": res.value,
                           "probes": [(p.load, p.ok, p.stopped, p.seconds) for p in res.probes]})
            print(json.dumps(rounds[-1]))
    ratios = []
    for i in range(args.rounds):
        on, off = (next(r for r in rounds if r["round"] == i and r["stop_early"] == s) for s in (True, False))
        ratios.append(on["search_s"] / off["search_s"])
    print(f"model={args.model} slo={args.slo}s torch {torch.__version__}: search time with / without early stop, "
          f"per round: {', '.join(f'{r:.2f}x' for r in ratios)} (median {statistics.median(ratios):.2f}x); answers "
          f"with {[r['value'] for r in rounds if r['stop_early']]}, without {[r['value'] for r in rounds if not r['stop_early']]}")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rounds": rounds,
                                        "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
