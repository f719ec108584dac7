"""benchmarks/cpu_switches.py --variant: a config of the table run again with some engine fields changed (e.g.
all on at the baseline's concurrency); a bad config name or field is refused, naming the valid ones."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from cpu_switches import CONFIGS, parse_variant  # noqa: E402

from optladder.engine.config import EngineConfig  # noqa: E402


def test_a_variant_names_its_config_and_typed_fields():
    label, name, fields = parse_variant("all on:max_num_seqs=3,max_num_batched_tokens=64,prefix_cache=false")
    assert (label, name) == ("all on, max_num_seqs=3, max_num_batched_tokens=64, prefix_cache=False", "all on")
    assert fields == {"max_num_seqs": 3, "max_num_batched_tokens": 64, "prefix_cache": False}
    cfg = EngineConfig(**{**CONFIGS[name], **fields})  # what the script builds from it
    assert cfg.max_num_seqs == 3 and cfg.chunked_prefill and not cfg.prefix_cache
    assert parse_variant("baseline:kv_cache_gb=0.5")[2] == {"kv_cache_gb": 0.5}


@pytest.mark.parametrize("text, says", [
    ("nope:max_num_seqs=3", "the config before ':' is one of 'baseline'"),
    ("all on:bogus=1", "'bogus=1' is not KEY=VALUE with KEY an engine field"),
    ("all on:max_num_seqs", "is not KEY=VALUE"),
    ("all on", "give at least one KEY=VALUE"),
    ("all on:max_num_seqs=abc", "max_num_seqs='abc' is not a int"),
    ("all on:max_num_seqs=3.5", "max_num_seqs='3.5' is not a int"),
    ("all on:prefix_cache=maybe", "prefix_cache='maybe' is not a bool"),
    ("all on:speculative=x", "speculative='x' is not a"),
])
def test_a_bad_variant_is_refused_before_any_run(text, says):
    with pytest.raises(ValueError, match="--variant"):
        parse_variant(text)
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_switches.py"), "--variant", text],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and says in p.stderr


@pytest.mark.parametrize("args, says", [
    (["--variant", "all on:max_num_seqs=0"], "--variant 'all on, max_num_seqs=0': engine.max_num_seqs must be >= 1"),
    (["--variant", "all on:max_num_seqs=3", "--variant", "all on:max_num_seqs=3"], "the same variant twice"),
])
def test_a_variant_the_engine_would_refuse_is_refused_before_any_run(args, says):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_switches.py"), *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and says in p.stderr
