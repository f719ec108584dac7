"""Bugs planted in lossless switches (engine.debug_plant) fail the near-tie check through run.py, exit 1, naming
the prompt and the output position; the same switches without the bug pass it. Random weights (model=tiny) in
float32: the check must catch a bug there too, where the distributions are flat."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny", "replay.progress=false", "engine.kv_cache_gb=0.05", "engine.max_model_len=1024",
        "tracking.enabled=false", "quality.max_new_tokens=24", "quality.num_prompts=24", "workload.num_requests=4",
        "workload.rate=20", "engine.max_num_batched_tokens=64"]  # a small budget: prompts come in several chunks
CASES = {  # plant -> the A/B it rides on and that A/B's candidate
    "kv_block_off_by_one": ("dynamic_batching", "+opt=dynamic_batching"),
    "rope_off_by_one_chunk": ("chunked_prefill", "+opt=[paged_kv,dynamic_batching,chunked_prefill]"),
    "stale_kv_slot": ("batched_decode", "+opt=batched_decode"),
}


def ab(name: str, candidate: list[str], out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "OPTLADDER_CACHE": str(ROOT / ".cache")}
    p = subprocess.run([sys.executable, "run.py", f"+ab={name}", f"ab.candidate=[{','.join(candidate)}]",
                        f"hydra.run.dir={out}", *FAST], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    verdict = out / "verdict.json"
    assert verdict.is_file(), p.stderr[-3000:]
    return p, json.loads(verdict.read_text())


def near_tie(v: dict) -> dict:
    return next(g for g in v["gates"] if g["gate"] == "near_tie")


@pytest.mark.parametrize("plant", sorted(CASES))
def test_a_planted_bug_fails_the_near_tie_check_naming_prompt_and_position(plant, tmp_path):
    name, candidate = CASES[plant]
    p, v = ab(name, [candidate, f"engine.debug_plant={plant}"], tmp_path / "ab")
    assert v["candidate_lossless"] is True and "at each fork" in v["lossless_reason"]
    g = near_tie(v)
    assert g["status"] == "fail" and g["decides"], g["reason"]
    assert "prompt 'builtin-" in g["reason"] and "at output position" in g["reason"]
    assert p.returncode == 1 and v["status"] == "fail"
    report = json.loads((tmp_path / "ab" / "candidate-r0" / "near_tie.json").read_text())
    assert report["not_near_ties"] and report["diverged"] > report["near_ties"]


@pytest.mark.parametrize("plant", sorted(CASES))
def test_the_same_switch_without_the_bug_passes_it(plant, tmp_path):
    name, candidate = CASES[plant]
    p, v = ab(name, [candidate], tmp_path / "ab")
    g = near_tie(v)
    assert g["status"] == "pass" and g["decides"], g["reason"]
    assert p.returncode in (0, 2) and v["status"] != "fail", v["gates"]  # latency on 4 requests may not decide
    exact = next(g for g in v["gates"] if g["metric"] == "quality/exact_match_vs_control")
    assert not exact["decides"]
