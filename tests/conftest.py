"""Shared fixtures: the real Hydra config, composed once per call with cheap settings forced, and a tracking
database of its own for every test."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from optladder.experiments.schema import register

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "optladder" / "conf"
CHEAP = ["model=tiny", "workload.num_requests=6", "workload.rate=20", "quality.num_prompts=3",
         "quality.max_new_tokens=8", "replay.progress=false", "replay.warmup_requests=1",
         "engine.kv_cache_gb=0.05", "engine.max_model_len=1024", "tracking.system_metrics=false"]


def data_root(needs: str) -> Path | None:
    """The data root (OPTLADDER_DATA, else ../shared/data beside the checkout) if it holds `needs`, else None:
    the tests that read real data skip without it."""
    root = Path(os.environ.get("OPTLADDER_DATA") or ROOT.parent / "shared" / "data")
    return root if (root / needs).is_file() else None


def compose_config(overrides: list[str] | None = None, cheap: bool = True):
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=(CHEAP if cheap else []) + list(overrides or []))


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: on a 2-core machine that other jobs share, float32 matmuls whose threads wait
    on a descheduled sibling ran 5-10x slower (the model tests: 7 min instead of 1.5); one thread is steady."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tracking_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="session")
def mlflow_server_uri(tmp_path_factory) -> str:
    """One real `mlflow server` (SQLite) for the scale-out tests of the whole session: it takes seconds to start."""
    from tests.services import mlflow_server

    tmp = tmp_path_factory.mktemp("mlflow-server")
    with mlflow_server(f"sqlite:///{tmp / 'mlflow.db'}", tmp / "artifacts") as uri:
        yield uri
