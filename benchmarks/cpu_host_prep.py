"""Host time of a decode step's block tables: each sequence's numpy copy kept in step with its list
(ModelRunner._table_rows) against converting every list whole each step (table_rows_from_lists, what the
runner did before), side by side in one run, the two alternating round after round.

    .venv/bin/python benchmarks/cpu_host_prep.py [--rounds 5] [--steps 200] [--out PREFIX]

Sequences as the Azure replay makes them on the 8B shape: contexts of 1,000-3,000 tokens in 16-token blocks
(63-188 entries a table), every sequence one token longer each step (a block appended every 16 steps), and
the decode step's inputs as the runner builds them (`prepare_decode`: token ids, positions, slots, context
lengths and the tables, on the CPU, so the copy to a device is not in it). Reported: microseconds a step for
the tables alone and for the whole input preparation, medians over rounds, and new / old.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from optladder.engine.model_runner import ModelRunner, table_rows_from_lists  # noqa: E402
from optladder.engine.sequence import SamplingParams, Sequence  # noqa: E402

BLOCK = 16


class _Runner(ModelRunner):
    """The runner's input preparation without a model: the host side of a step only."""

    def __init__(self, cached: bool, max_model_len: int = 4096):
        self.block_size, self.device = BLOCK, torch.device("cpu")
        self.table_capacity = -(-max_model_len // BLOCK) + 8
        if not cached:
            self._table_rows = table_rows_from_lists


def _sequences(n: int, seed: int) -> list[Sequence]:
    rng = random.Random(seed)
    free = iter(rng.sample(range(1_000_000), 200 * n + 10_000))
    seqs = []
    for i in range(n):
        s = Sequence(f"r{i}", [rng.randrange(49_152) for _ in range(rng.randrange(1000, 3000))], SamplingParams())
        s.block_table = [next(free) for _ in range(-(-len(s) // BLOCK))]
        s.num_computed_tokens = len(s) - 1
        s._free = free
        seqs.append(s)
    return seqs


def _step(seqs: list[Sequence]) -> None:
    """Each sequence gets its next token; a new block when it crosses a block boundary (BlockManager.may_append)."""
    for s in seqs:
        s.token_ids.append(1)
        if len(s.block_table) * BLOCK < len(s):
            s.block_table.append(next(s._free))
        s.num_computed_tokens = len(s) - 1


def measure(n: int, cached: bool, steps: int, seed: int) -> dict[str, float]:
    runner, seqs = _Runner(cached), _sequences(n, seed)
    tables = prep = 0.0
    for _ in range(steps):
        _step(seqs)
        t0 = time.perf_counter()
        runner._table_rows(seqs)
        t1 = time.perf_counter()
        runner.prepare_decode(seqs)
        t2 = time.perf_counter()
        tables += t1 - t0
        prep += t2 - t1
    return {"tables_us": tables / steps * 1e6, "prepare_decode_us": prep / steps * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--sizes", default="1,32,256", help="sequences a step")
    ap.add_argument("--out", type=Path, help="PREFIX: writes PREFIX.md and PREFIX.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sizes = [int(x) for x in args.sizes.split(",")]
    # the same sequences for both (same seed a round), modes alternating which goes first
    res = {n: {"old": [], "new": []} for n in sizes}
    t0 = time.time()
    for r in range(args.rounds):
        for n in sizes:
            order = (("old", False), ("new", True)) if r % 2 == 0 else (("new", True), ("old", False))
            for name, cached in order:
                res[n][name].append(measure(n, cached, args.steps, seed=r))
    rows = []
    for n in sizes:
        med = {m: {k: statistics.median(x[k] for x in res[n][m]) for k in ("tables_us", "prepare_decode_us")}
               for m in ("old", "new")}
        rows.append({"sequences": n, **{f"{m}_{k}": v for m in med for k, v in med[m].items()},
                     "tables_ratio": med["new"]["tables_us"] / med["old"]["tables_us"],
                     "prepare_ratio": med["new"]["prepare_decode_us"] / med["old"]["prepare_decode_us"]})
    env = (f"{platform.machine()}, {torch.get_num_threads()} torch thread, Python {platform.python_version()}, "
           f"torch {torch.__version__}; {args.rounds} rounds of {args.steps} steps; {time.time() - t0:.0f} s")
    lines = ["# Block tables of a decode step: kept numpy copies against whole-list conversion", "",
             f"`{' '.join(['.venv/bin/python', 'benchmarks/cpu_host_prep.py', *sys.argv[1:]])}`: {env}. "
             "Medians over rounds, microseconds a step.", "",
             "| sequences | tables, old µs | tables, new µs | new / old | prepare_decode, old µs | "
             "prepare_decode, new µs | new / old |", "|---|---|---|---|---|---|---|"]
    for x in rows:
        lines.append(f"| {x['sequences']} | {x['old_tables_us']:.1f} | {x['new_tables_us']:.1f} | "
                     f"{x['tables_ratio']:.2f}× | {x['old_prepare_decode_us']:.1f} | "
                     f"{x['new_prepare_decode_us']:.1f} | {x['prepare_ratio']:.2f}× |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text + "\n")
        args.out.with_suffix(".json").write_text(json.dumps({"env": env, "rows": rows, "raw": {
            str(n): res[n] for n in sizes}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
