"""A non-editable install runs from anywhere: `pip install .` into a fresh venv, then `optladder run model=tiny`
from a directory outside the checkout. The config, the builtin workload and prompts must come from the
installed package (package data), and the run's MLflow store lands in the directory it runs in."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding a wheel of this checkout; the dependencies come from this interpreter's
    site-packages through a .pth line (a path added so is no site dir: the editable install's finder there
    is not run), so the test needs no registry."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    src = tmp_path_factory.mktemp("src")  # a copy: setuptools writes build/ into the tree it builds
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True).stdout.split("\n")
    if not any(listed):
        pytest.skip("not a git checkout: which files belong to the project is git's to say")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(site), str(src)],
                   check=True, cwd=src, capture_output=True, text=True)
    return site


def test_the_installed_package_is_not_the_checkout(installed):
    python = installed.parents[2] / "bin" / "python"  # <venv>/lib/pythonX.Y/site-packages
    where = subprocess.run([python, "-c", "import optladder, optladder.paths as p; "
                            "print(optladder.__file__); print(p.CHECKOUT)"], capture_output=True, text=True,
                           check=True, cwd=installed).stdout.split("\n")
    assert str(installed) in where[0] and not where[0].startswith(str(ROOT)), where
    assert where[1] == "None"
    conf = Path(where[0]).parent / "conf"
    assert (conf / "config.yaml").is_file() and (conf / "opt" / "flash_attn.yaml").is_file()
    assert (Path(where[0]).parent / "quality" / "builtin_prompts.jsonl").is_file()


def test_optladder_run_from_outside_the_checkout(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPTLADDER_HOME")}
    script = installed / "bin" / "optladder"  # the console script pip wrote
    assert script.is_file()
    cmd = [installed.parents[2] / "bin" / "python", script, "run", "model=tiny", "workload.num_requests=4",
           "quality.num_prompts=4", "engine.cpu_threads=1", "tracking.system_metrics=false", "replay.progress=false"]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "TTFT" in p.stdout
    assert (tmp_path / "mlflow.db").is_file()  # the store of the directory it ran in, not the checkout's
    summaries = list((tmp_path / "outputs").rglob("summary.json"))
    assert len(summaries) == 1
