"""One MLflow tracking server for every job, wherever it runs: `make mlflow-server`, then
`tracking.uri=http://127.0.0.1:5000`.

What the client checks before anything starts (so a sweep never runs an hour into a dead server):
an http(s) URI must answer /health, and a database URI must have its driver importable, naming the
package to install. The server itself is MLflow's own `mlflow server`: `python -m optladder.experiments.tracking_server`
checks the database URI the same way, then hands over to it.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from optladder.paths import PROJECT_ROOT

# SQLAlchemy's DBAPI driver name -> (the module it imports, the pip package that provides it). Which driver a
# plain postgresql:// means is SQLAlchemy's choice (psycopg2 up to 2.0, psycopg 3 from 2.1), so it is asked.
DB_DRIVERS = {
    "psycopg": ("psycopg", "psycopg[binary]"),
    "psycopg2": ("psycopg2", "psycopg2-binary"),
    "pg8000": ("pg8000", "pg8000"),
    "asyncpg": ("asyncpg", "asyncpg"),
    "mysqldb": ("MySQLdb", "mysqlclient"),
    "pymysql": ("pymysql", "pymysql"),
}
HEALTH_TIMEOUT_S = 5.0
DEFAULT_BACKEND = "sqlite:///.mlflow-server/mlflow.db"
DEFAULT_ARTIFACTS = ".mlflow-server/artifacts"


class TrackingUnavailable(RuntimeError):
    """The tracking server does not answer: raised before any job starts."""


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def check_driver(uri: str, setting: str = "tracking.uri") -> None:
    """A database URI whose driver is not installed fails here with the package to install, not deep in
    SQLAlchemy with a ModuleNotFoundError."""
    if "://" not in uri or uri.startswith(("sqlite:", "file:", "http:", "https:", "databricks")):
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        driver = make_url(uri).get_dialect().driver
    except (ArgumentError, NoSuchModuleError):
        return  # not a database SQLAlchemy knows: an MLflow store plugin's own scheme, its own checks
    module, package = DB_DRIVERS.get(driver, (driver, driver))
    if importlib.util.find_spec(module) is None:
        extra = " (or the project's extra: pip install -e '.[postgres]')" if driver == "psycopg" else ""
        raise ValueError(f"{setting}={redact(uri)} needs the database driver {module!r}, which is not installed: "
                         f"pip install '{package}'{extra}")


def check_server(uri: str, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """One GET /health; MLflow's own client would retry for minutes before saying the server is down."""
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            if resp.status == 200:
                return
            reason = f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        reason = f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        reason = str(getattr(e, "reason", e))
    raise TrackingUnavailable(
        f"tracking.uri={uri}: no MLflow tracking server answers at {url} ({reason}). Start one with "
        "`make mlflow-server` (or `mlflow server`), or track locally: tracking.uri=sqlite:///mlflow.db, "
        "or not at all: tracking=off")


def check_uri(uri: str) -> str:
    """Everything that can be known about a tracking URI before a run starts; returns it unchanged."""
    if is_server(uri):
        check_server(uri)
    else:
        check_driver(uri)
    return uri


def redact(uri: str) -> str:
    """postgresql://user:secret@host/db -> postgresql://user:***@host/db, for messages and logs."""
    head, sep, rest = uri.partition("://")
    if not sep or "@" not in rest:
        return uri
    cred, _, host = rest.rpartition("@")
    user = cred.split(":", 1)[0]
    return f"{head}://{user}:***@{host}" if ":" in cred else uri


def server_command(backend: str, artifacts: str, host: str, port: int, workers: int) -> list[str]:
    """`mlflow server` with a database backend and a served artifact root (clients upload through it)."""
    if backend.startswith("sqlite:///") and not backend[len("sqlite:///"):].startswith("/"):
        path = PROJECT_ROOT / backend[len("sqlite:///"):]
        path.parent.mkdir(parents=True, exist_ok=True)
        backend = "sqlite:///" + str(path)
    artifacts_dir = Path(artifacts) if Path(artifacts).is_absolute() else PROJECT_ROOT / artifacts
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
            "--artifacts-destination", str(artifacts_dir), "--serve-artifacts",
            "--host", host, "--port", str(port), "--workers", str(workers)]


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Start MLflow's tracking server with a database backend")
    p.add_argument("--backend-store-uri", default=DEFAULT_BACKEND,
                   help="sqlite:///path (relative: from the project root) or postgresql://user:pw@host:port/db")
    p.add_argument("--artifacts-destination", default=DEFAULT_ARTIFACTS)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    try:
        check_driver(a.backend_store_uri, "--backend-store-uri")
    except ValueError as e:
        sys.exit(f"error: {e}")
    if not _installed("mlflow"):  # the full distribution: mlflow-skinny has no server stack
        sys.exit("error: the MLflow server is not installed (the project needs only MLflow's client): "
                 "pip install -e '.[server]'")
    cmd = server_command(a.backend_store_uri, a.artifacts_destination, a.host, a.port, a.workers)
    print(f"mlflow server: {redact(a.backend_store_uri)}, artifacts in {cmd[cmd.index('--artifacts-destination') + 1]}, "
          f"http://{a.host}:{a.port}  (runs: tracking.uri=http://{a.host}:{a.port})", flush=True)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
