"""Look at optladder's MLflow runs in a real browser: the checks a test suite cannot make, and the screenshots
in docs/. Headless Chromium from Debian's package (apt-get install chromium); nothing else to install.

    python docs/mlflow_screenshots.py                              # a small sweep first, then the checks
    python docs/mlflow_screenshots.py --db /path/to/mlflow.db      # an existing tracking database

It starts `mlflow server` on 127.0.0.1 (a free port) over the database, renders in Chromium the latest
sweep's jobs side by side (MLflow's compare page) and one job's run page, checks that they show every job
under its own name (engine:opts:model, a skipped job marked so), the parent named by its sweep, and the tags
that tell jobs apart, and saves docs/mlflow_sweep.png and docs/mlflow_run.png. Exit status 1 when a check
fails.
"""
from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["-m", "+opt=cuda_graphs,paged_kv,prefix_cache", "model=tiny", "workload.num_requests=6",
         "quality.num_prompts=4", "quality.max_new_tokens=8", "replay.progress=false", "replay.load_levels=[5,20]"]
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--hide-scrollbars", "--window-size=1800,1300", "--virtual-time-budget=30000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sweep(db: Path) -> None:
    subprocess.run([sys.executable, "run.py", *SWEEP, f"tracking.uri=sqlite:///{db}",
                    f"hydra.sweep.dir={db.parent / 'sweep'}"], cwd=ROOT, check=True)


def start_server(db: Path, port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(240):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return server
        except OSError:
            time.sleep(0.5)
    server.terminate()
    raise RuntimeError(f"mlflow server did not answer on port {port} within 2 minutes")


def chromium(args: list[str], profile: Path) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("no chromium on PATH: apt-get install -y chromium")
    out = subprocess.run([exe, *CHROME_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                         text=True, timeout=300)
    return out.stdout


def check_and_shoot(db: Path, out_dir: Path) -> list[str]:
    """The sweep's job runs side by side (MLflow's compare page) and one job's run page: each check is a
    string the rendered page must contain."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("optladder")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    parent = next(r for r in runs if r.data.tags.get("optladder.kind") == "sweep")
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    job = next((r for r in kids if "optladder.added_needs" in r.data.tags), kids[0])
    ids = urllib.parse.quote(json.dumps([r.info.run_id for r in kids]))
    pages = {  # file -> (url path, what it must show)
        "mlflow_sweep.png": (f"compare-runs?runs={ids}&experiments=%5B%22{exp.experiment_id}%22%5D",
                             [r.info.run_name for r in kids]),
        "mlflow_run.png": (f"experiments/{exp.experiment_id}/runs/{job.info.run_id}",
                           [job.info.run_name, parent.info.run_name, "opt.paged_kv", "optladder.added_needs",
                            "workload", "dtype", "sweep.opt"]),
    }
    port = free_port()
    server = start_server(db, port)
    failures = []
    try:
        with tempfile.TemporaryDirectory() as profile:
            for name, (path, expected) in pages.items():
                url = f"http://127.0.0.1:{port}/#/{path}"
                dom = chromium(["--dump-dom", url], Path(profile))
                failures += [f"{name}: {text!r} not shown" for text in expected if text not in dom]
                chromium([f"--screenshot={out_dir / name}", url], Path(profile))
    finally:
        server.terminate()
        server.wait(timeout=30)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, help="an existing SQLite tracking database (default: run a sweep)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    tmp = None
    if args.db is None:
        tmp = Path(tempfile.mkdtemp(prefix="optladder-ui-"))
        args.db = tmp / "mlflow.db"
        run_sweep(args.db)
    failures = check_and_shoot(args.db.resolve(), args.out)
    for f in failures:
        print("FAIL", f)
    print(f"{'ok' if not failures else 'failed'}: screenshots in {args.out}")
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
