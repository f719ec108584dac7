"""Faults, as a run meets them (model=tiny): the engine raising mid-replay, SIGTERM and SIGINT to run.py,
the MLflow store unreachable at start or lost mid-run. Each must leave the run FAILED or KILLED in MLflow
(or say that tracking was unreachable before anything ran), every finished request on disk, no child
process behind, and an exit status that says what happened (optladder/experiments/lifecycle.py). Signals and exit
statuses need run.py in a process of its own; the rest runs here, which is cheaper."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from optladder.backends.faults import InjectedFault
from optladder.experiments import tracking
from optladder.experiments.experiment import run_experiment
from optladder.experiments.lifecycle import exit_status
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]
FAST = ["replay.progress=false", "tracking.system_metrics=false", "quality.num_prompts=2",
        "quality.max_new_tokens=4", "engine.cpu_threads=1", "engine.dynamic_batching=true", "engine.paged_kv=true"]


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_records(run_dir: Path, n: int, alive, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while len(records(run_dir)) < n:
        assert alive(), "the run ended before the records came"
        assert time.monotonic() < deadline, "no request finished in time"
        time.sleep(0.1)


def statuses(uri: str) -> list[str]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("optladder")
    return [r.info.status for r in client.search_runs([exp.experiment_id])]


def replay_workers_alive(since: float) -> list[str]:
    """Locust workers started from this checkout since `since` and still running: orphans."""
    alive = []
    for p in psutil.process_iter(["cmdline", "create_time", "cwd"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "optladder.traffic.locust_worker" in cmd and p.info["create_time"] >= since - 1 and p.info["cwd"] == str(ROOT):
            alive.append(f"{p.pid}: {cmd}")
    return alive


@pytest.mark.parametrize("driver", ["inprocess", "locust"])
def test_the_engine_raising_mid_replay_fails_the_run_and_keeps_the_records(tmp_path, driver, one_torch_thread):
    t0, uri, out = time.time(), f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    cfg = compose_config([*FAST, f"tracking.uri={uri}", f"replay.driver={driver}", "workload.num_requests=8",
                          "workload.rate=4", "faults.fail_after_steps=40"])
    with pytest.raises((InjectedFault, RuntimeError), match="injected engine failure") as err:
        run_experiment(cfg, out)
    assert exit_status(err.value) == 70
    assert statuses(uri) == ["FAILED"]
    assert "injected engine failure" in (out / "error.txt").read_text()
    recs = records(out)
    assert len(recs) == 8 and all(r["ok"] or r["error"] for r in recs)  # every request, finished or failed
    assert any(r["ok"] for r in recs) and not all(r["ok"] for r in recs)
    assert replay_workers_alive(t0) == []


def test_an_unreachable_store_stops_the_run_before_anything_loads(tmp_path):
    cfg = compose_config([*FAST, "tracking.uri=http://127.0.0.1:9"])
    with pytest.raises(tracking.TrackingUnreachable, match="the MLflow store is unreachable") as err:
        run_experiment(cfg, tmp_path / "run")
    assert "tracking.enabled=false" in str(err.value) and exit_status(err.value) == 69
    assert not (tmp_path / "run" / "requests.jsonl").exists()  # no model was loaded, nothing was replayed


@pytest.mark.e2e
def test_a_store_lost_mid_run_keeps_the_results_and_says_so(tmp_path, monkeypatch, caplog, one_torch_thread):
    monkeypatch.setattr(tracking, "LOST", [])
    store, out = tmp_path / "store", tmp_path / "run"
    store.mkdir()
    cfg = compose_config([*FAST, f"tracking.uri=sqlite:///{store / 'mlflow.db'}", "workload.num_requests=20",
                          "workload.rate=4"])
    result: list = []
    worker = threading.Thread(target=lambda: result.append(run_experiment(cfg, out)))
    worker.start()
    wait_for_records(out, 2, worker.is_alive)
    store.rename(tmp_path / "gone")  # the store's folder vanishes under the run, as an unmounted volume would
    worker.join(600)
    assert result, "the run died with the store"
    assert len(records(out)) == 20 and (out / "summary.json").exists()  # it finished locally
    assert tracking.LOST and "attempt to write a readonly database" in tracking.LOST[0]
    assert "tracking lost mid-run" in caplog.text


@pytest.mark.e2e
@pytest.mark.parametrize("sig, code, driver", [(signal.SIGTERM, 143, "locust"), (signal.SIGINT, 130, "inprocess")])
def test_a_signal_mid_replay_kills_the_run_cleanly(tmp_path, sig, code, driver):
    t0, uri, out = time.time(), f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "run.py", "model=tiny", "engine.kv_cache_gb=0.05",
                             "engine.max_model_len=1024", *FAST, f"tracking.uri={uri}", f"hydra.run.dir={out}",
                             f"replay.driver={driver}", "workload.num_requests=40", "workload.rate=2"],
                            cwd=ROOT, env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_records(out, 2, lambda: proc.poll() is None)
        proc.send_signal(sig)
        log, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, log[-3000:]
    assert "stopped by" in log
    assert statuses(uri) == ["KILLED"]
    recs = records(out)
    assert sum(r["ok"] for r in recs) >= 2  # what finished is on disk
    assert not (out / "summary.json").exists()
    assert replay_workers_alive(t0) == []


VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(not VLLM_PY.exists(), reason="vLLM not installed in .venv-vllm")
@pytest.mark.timeout(1800)
def test_vllm_serve_killed_mid_replay_fails_the_run_and_leaves_nothing_behind(tmp_path):
    from optladder.backends.launcher import free_port
    from optladder.backends.vllm_server import ServerGone

    port, uri, out = free_port("127.0.0.1"), f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    cfg = compose_config(["engine=vllm", "model=smollm2_135m", "workload.num_requests=30", "workload.rate=1",
                          "quality.num_prompts=2", "engine.kv_cache_gb=1", f"engine.server.port={port}",
                          f"tracking.uri={uri}", "tracking.system_metrics=false", "replay.progress=false"])
    failure: list[BaseException] = []

    def run() -> None:
        try:
            run_experiment(cfg, out)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            failure.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    wait_for_records(out, 2, worker.is_alive, timeout_s=1500)
    group = {os.getpgid(p.pid) for p in psutil.process_iter(["cmdline"])
             if "vllm_cli.py" in " ".join(p.info["cmdline"] or []) and f"--port {port}" in " ".join(p.info["cmdline"])}
    assert group, "no vllm serve process found on the run's port"
    for pgid in group:
        os.killpg(pgid, signal.SIGKILL)  # the whole server, as an OOM kill or a crashed node would
    worker.join(600)
    assert failure and isinstance(failure[0], ServerGone), failure
    assert "vllm serve exited with status" in str(failure[0]) and exit_status(failure[0]) == 70
    assert statuses(uri) == ["FAILED"]
    recs = records(out)
    assert len(recs) == 30 and sum(r["ok"] for r in recs) >= 2  # every request accounted for, what finished kept
    survivors = [p.pid for p in psutil.process_iter() if _pgid(p.pid) in group]
    assert survivors == []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
