"""Return to the previously promoted baseline.

    python -m optladder.abtest.rollback [--registry DIR] [--show]

Prints the restored baseline's overrides and the command that reproduces it. Every opt stays an independent
switch, so rolling one opt back is one override on top of it (e.g. `engine.flash_attn=false`).
"""
from __future__ import annotations

import argparse
import sys

from optladder.abtest.rollout import DEFAULT_REGISTRY, current, rollback


def describe(entry: dict) -> str:
    snap = entry.get("snapshot", {})
    overrides = snap.get("overrides", [])
    quoted = " ".join(f"'{o}'" for o in overrides)
    return (f"{entry['name']} (run {entry['run_id']}, promoted {entry.get('promoted_at')})\n"
            f"  overrides: {overrides}\n  reproduce: python run.py {quoted}".rstrip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Return to the previously promoted baseline.")
    p.add_argument("--registry", default=str(DEFAULT_REGISTRY))
    p.add_argument("--show", action="store_true", help="print the current baseline, change nothing")
    args = p.parse_args(argv)
    if args.show:
        entry = current(args.registry)
        print(describe(entry) if entry else f"no promoted baseline in {args.registry}")
        return 0
    try:
        entry = rollback(args.registry)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("rolled back to:", describe(entry), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
