"""`optladder bench`: the stable measurements, one harness (the one-off studies stay in benchmarks/).

    optladder bench latency [...]    a decode step at fixed batch sizes, baseline and candidate side by side
    optladder bench switches [...]   each reference-engine switch alone and all on, one workload, on the CPU
"""
from __future__ import annotations

import importlib
import sys

BENCHES = {"latency": "optladder.bench.latency", "switches": "optladder.bench.switches"}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    if args[0] not in BENCHES:
        print(f"optladder: error: unknown bench {args[0]!r}; valid: {sorted(BENCHES)}", file=sys.stderr)
        return 2
    return importlib.import_module(BENCHES[args[0]]).main(args[1:]) or 0
