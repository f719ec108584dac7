"""Real services for the scale-out tests, started and stopped by the tests: MLflow's tracking server and a
throwaway PostgreSQL cluster from Debian's package (.ci/run installs it; where it is absent the tests skip)."""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root (CI runs as root): run it as the package's own user then."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextmanager
def postgres_cluster(db: str = "mlflow"):
    """A fresh cluster on a free 127.0.0.1 port with trust auth; yields its SQLAlchemy URI (psycopg 3)."""
    bin_dir = postgres_bin()
    assert bin_dir is not None
    data = Path(tempfile.mkdtemp(prefix="optladder-pg-"))  # not under pytest's root-only tmp: postgres reads it
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    port = free_port()
    run = lambda *c: subprocess.run(_as_postgres([str(bin_dir / c[0]), *c[1:]]), check=True,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    try:
        run("initdb", "-D", str(data / "db"), "-A", "trust", "-U", "postgres", "--no-sync")
        run("pg_ctl", "-D", str(data / "db"), "-l", str(data / "log"), "-w", "-t", "60",
            "-o", f"-h 127.0.0.1 -p {port} -k {data} -F", "start")
        run("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", db)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/{db}"
    finally:
        subprocess.run(_as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


@contextmanager
def mlflow_server(backend: str, artifacts: Path, workers: int = 2, timeout_s: float = 300.0):
    """`python -m optladder.experiments.tracking_server` (what `make mlflow-server` runs); yields its http URI."""
    port = free_port()
    log = open(artifacts.parent / f"mlflow-server-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "optladder.experiments.tracking_server", "--backend-store-uri", backend,
                             "--artifacts-destination", str(artifacts), "--port", str(port),
                             "--workers", str(workers)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, Path(log.name).read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer /health in time"
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, 15)  # the server and its uvicorn workers
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()
