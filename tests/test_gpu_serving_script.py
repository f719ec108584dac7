"""benchmarks/gpu_serving_vs_vllm.py's own logic, on its 2-layer CPU shape (GPU_SERVING_TINY): the measured
replays are never profiled (starting the torch profiler stalled the H200 engine for seconds and made the first
4x repeat's tail), a further replay carries the profiler and records exactly the steps it names, and every
replay logs each step."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import data_root

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_serving_vs_vllm.py"
TRACE = "traces/azure_conv_2023.csv"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = data_root(TRACE)
    if root is None:
        pytest.skip(f"no {TRACE} under the data root")
    tmp = tmp_path_factory.mktemp("serving")
    reqs = tmp / "requests.json"
    env = dict(os.environ, GPU_SERVING_TINY="1")
    subprocess.run([sys.executable, str(SCRIPT), "--make-requests", str(root / TRACE), "--requests", str(reqs)],
                   check=True, env=env, cwd=ROOT)
    out = tmp / "out"
    p = subprocess.run([sys.executable, str(SCRIPT), "--only", "ours", "--requests", str(reqs), "--out", str(out),
                        "--repeats", "2", "--skip-bursts", "--skip-ablation"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(reqs.read_text())[:12]  # the tiny shape replays the first 12
    return json.loads((out / "serving_ours.json").read_text()), out, rows


def test_measured_replays_are_not_profiled_and_log_every_step(tiny_run):
    res, out, rows = tiny_run
    (scale, runs), = res["replay"].items()
    assert len(runs) == 2
    prompt = sum(min(max(1, n_in), 200) for _, n_in, _ in rows)  # the tiny shape clips inputs to 200 tokens
    decode = sum(n_out - 1 for _, _, n_out in rows)  # a request's first token comes from its last prompt step
    for run in runs:
        assert "profiled_steps" not in run and "profiler_stall_s" not in run
        log = run["step_log"]
        assert len(log) == run["chunked_prefill"]["steps"]  # one entry a step of the engine
        assert [x[0] for x in log] == sorted(x[0] for x in log)
        assert sum(x[2] for x in log) == prompt and sum(x[3] for x in log) == decode
    assert "decode_b1" not in res and "burst_64x1000_128" not in res  # --skip-bursts
    assert "replay_no_chunked" not in res  # --skip-ablation


def test_the_profiled_replay_records_the_steps_it_names(tiny_run):
    res, out, _ = tiny_run
    (scale, run), = res["replay_profiled"].items()
    a, b = run["profiled_steps"]
    log = res["replay"][scale][-1]["step_log"]
    # the window starts where the last measured repeat was PROFILE_FROM_S (0.05 s on the tiny shape) in
    assert a == next(i for i, x in enumerate(log) if x[0] >= 50.0) and b - a == 3
    table = (out / "profile_ours_replay.txt").read_text()
    listed = table.splitlines()[0].split(": ", 1)[1]
    assert [tuple(map(int, t.split(", ")[1:])) for t in listed.strip("()").split("), (")] == \
        [(x[2], x[3]) for x in run["step_log"][a:b]]
    # the profiler itself recorded those steps (its schedule: ProfilerStep#N is the replay's N-th step), no others
    assert run["profiled_step_numbers"] == list(range(a, b))
    assert [line.split()[-1] for line in table.splitlines() if line.strip().startswith("ProfilerStep*")] == ["3"]
    assert run["profile_window"] == f"from step {a}, where the last measured repeat was 0.05 s in"
    md = (out / "gpu_serving_vs_vllm.md").read_text()
    assert "not counted above" in md and "optladder, chunked_prefill (repeat 2)" in md
