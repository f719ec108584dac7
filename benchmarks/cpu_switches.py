"""The CPU switch table, `optladder bench switches` (optladder/bench/switches.py): kept here so the documented
`python benchmarks/cpu_switches.py ...` commands still work from a checkout."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without an install

from optladder.bench.switches import CONFIGS, main, parse_variant  # noqa: E402, F401

if __name__ == "__main__":
    main()
