"""Sweeps under every launcher, as a user runs them: the MLflow parent created once by the launching process,
every job a child of it whatever process runs it, and (Ray) no job on a GPU another job holds, checked with
logical GPUs on this CPU machine. SLURM's own config composes; its executor is tested locally."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from optladder.experiments.ray_launch import RaySettings, check_fits, check_local_gpus, gpus_for_job
from optladder.experiments.schema import register

pytestmark = pytest.mark.e2e  # processes of their own: the command, a server, a shell script

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny", "replay.progress=false", "engine.kv_cache_gb=0.05", "engine.max_model_len=1024",
        "tracking.system_metrics=false", "quality.max_new_tokens=8", "workload.rate=20",
        "workload.num_requests=4", "quality.num_prompts=2", "engine.cpu_threads=1"]


def sweep(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPTLADDER_CACHE": os.environ.get("OPTLADDER_CACHE", str(ROOT / ".cache"))}
    p = subprocess.run([sys.executable, "run.py", "-m", *FAST, *args, f"hydra.sweep.dir={tmp / 'sweep'}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return p


def parent_and_children(uri: str, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(children) == len(runs) - 1  # no run outside the sweep's parent
    return parents[0], children


def test_ray_sweep_one_parent_a_child_per_job_and_no_gpu_shared(tmp_path, mlflow_server_uri):
    exp = f"ray-{tmp_path.name}"
    # regular arrivals 3 s apart: every job replays for at least 9 s, so two jobs Ray runs at once overlap even
    # when one worker starts seconds after the other on a loaded machine (unpaced, a job lasts about 1.5 s)
    sweep(["hydra/launcher=ray", "hydra.launcher.num_cpus=2", "hydra.launcher.num_gpus=2", "seed=1,2",
           f"tracking.uri={mlflow_server_uri}", f"tracking.experiment={exp}", "workload.arrival=gamma",
           "workload.cv=0.01", "workload.rate=0.333"], tmp_path)
    parent, children = parent_and_children(mlflow_server_uri, exp)
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert sorted(c.data.params["seed"] for c in children) == ["1", "2"]
    device = {}
    for snap in (tmp_path / "sweep").glob("*/config_snapshot.json"):
        s = json.loads(snap.read_text())
        device[str(s["resolved_config"]["seed"])] = s["environment"]["cuda_visible_devices"]
    assert set(device.values()) <= {"0", "1"} and len(device) == 2  # one logical GPU each, granted by Ray
    spans = [(c.info.start_time, c.info.end_time, device[c.data.params["seed"]]) for c in children]
    overlapping = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:] if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, spans  # jobs ran at once...
    assert all(a[2] != b[2] for a, b in overlapping)  # ...never on the same GPU
    assert_sweep_table(tmp_path / "sweep", ["seed=1", "seed=2"])


def assert_sweep_table(sweep_dir: Path, swept: list[str]) -> None:
    """sweep.md lists every job, though the jobs ran in other processes than the one that writes it."""
    rows = [r for r in (sweep_dir / "sweep.md").read_text().splitlines()[2:] if r.startswith("|")]
    assert [r.split("|")[2].strip() for r in rows] == swept, rows
    assert all(r.split("|")[4].strip() == "ran" for r in rows), rows


def test_submitit_local_sweep_keeps_one_parent(tmp_path, mlflow_server_uri):
    exp = f"submitit-{tmp_path.name}"
    sweep(["hydra/launcher=submitit_local", "seed=1,2", f"tracking.uri={mlflow_server_uri}",
           f"tracking.experiment={exp}"], tmp_path)
    parent, children = parent_and_children(mlflow_server_uri, exp)
    assert parent.info.status == "FINISHED" and sorted(c.data.params["seed"] for c in children) == ["1", "2"]
    assert all(c.info.status == "FINISHED" for c in children)
    assert_sweep_table(tmp_path / "sweep", ["seed=1", "seed=2"])


def test_a_failed_job_closes_the_sweeps_parent_as_failed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "OPTLADDER_CACHE": os.environ.get("OPTLADDER_CACHE", str(ROOT / ".cache"))}
    p = subprocess.run([sys.executable, "run.py", "-m", "engine.block_size=3", f"tracking.uri={uri}",
                        f"hydra.sweep.dir={tmp_path / 'sweep'}", *FAST], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode != 0 and "block_size" in p.stderr
    parent, _ = parent_and_children(uri, "optladder")
    assert parent.info.status == "FAILED"  # not left RUNNING for ever


def hydra_compose(overrides: list[str]):
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "optladder" / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def test_launcher_configs_compose_against_their_schemas():
    slurm = hydra_compose(["hydra/launcher=submitit", "engine=vllm", "engine.server.tensor_parallel_size=2"])
    assert slurm.hydra.launcher._target_.endswith("SlurmLauncher") and slurm.hydra.launcher.gpus_per_node == 2
    ray = hydra_compose(["hydra/launcher=ray", "hydra.launcher.gpus_per_job=2"])
    settings = RaySettings(**{k: v for k, v in OmegaConf.to_container(ray.hydra.launcher).items() if k != "_target_"})
    assert settings.gpus_per_job == 2 and settings.address is None
    assert hydra_compose(["hydra/launcher=local"]).hydra.launcher._target_.endswith("BasicLauncher")
    for bad in ("hydra.launcher.gpu_per_job=2", "hydra.launcher.cpus_per_job=many"):  # misspelt, mistyped
        with pytest.raises(ConfigCompositionException):
            hydra_compose(["hydra/launcher=ray", bad])


def test_gpus_per_job_and_refusals_name_the_counts():
    engine = OmegaConf.create({"name": "vllm", "device": "auto", "server": {"tensor_parallel_size": 2}})
    assert gpus_for_job("auto", engine, node_gpus=8) == 2
    assert gpus_for_job("auto", engine, node_gpus=0) == 0  # a CPU-only cluster: jobs ask for no GPU
    assert gpus_for_job("auto", OmegaConf.create({"name": "reference", "device": "auto", "server": {}}), 2) == 1
    assert gpus_for_job("auto", OmegaConf.create({"name": "openai", "device": "auto", "server": {}}), 2) == 0
    assert gpus_for_job(3, engine, node_gpus=0) == 3
    with pytest.raises(ValueError, match=r"asks for 4 GPU\(s\), but the largest node of the Ray cluster has 2"):
        check_fits([1, 4], 2, ["#0 (seed=1)", "#1 (engine.server.tensor_parallel_size=4)"])
    check_fits([2, 2, 2], 2, ["a", "b", "c"])  # more jobs than GPUs: they wait their turn, not refused
    with pytest.raises(ValueError, match="num_gpus=4, but this machine has 2"):
        check_local_gpus(4, physical=2)
    check_local_gpus(2, physical=0)  # logical GPUs on a CPU machine: a dry run of the scheduling
    for bad in ("two", -1, 1.5):
        with pytest.raises(ValueError, match="gpus_per_job"):
            RaySettings(gpus_per_job=bad)
