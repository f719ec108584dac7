"""MLflow runs made on another machine (a GPU host that reaches nothing, not even this tracking store) brought
into this one with mlflow-export-import (the `transfer` extra), the ecosystem's tool for moving runs between
stores. There, `export` writes every experiment of its store as files (runs with their params, metrics and
their history, tags, artifacts); the files travel home with the rest of the results; here, `import` loads
them into this store and checks the result.

  python -m optladder.experiments.runs_transfer export --uri sqlite:////tmp/ladder/mlflow.db --out DIR   (the GPU host)
  python -m optladder.experiments.runs_transfer import DIR [--to URI]                  (here: make import-runs FROM=DIR)

DIR may also be a gzipped tar of such a folder (`tar czf export.tgz -C <parent> <folder>`): a committed export
of GPU runs is ~14x smaller so (their metric histories compress well), which matters where every file of the
repository travels in a size-limited device call.

What the import keeps, beyond what mlflow-export-import keeps on its own: every run's final status (the tool
marks every imported run FINISHED; a KILLED or FAILED rung stays so here), its start and end times (the tool
starts every run at the import), and parent/child nesting; the source's run id, times and user are the run's `mlflow_exim.*` tags. It is idempotent: each
imported run carries `optladder.source_run_id` (set last), a run already in the destination is not imported
again, and a run whose import was cut short (the tool's tag without ours) is set aside (deleted, restorable) and
imported again: a transfer cut short is finished by running it again. Experiment names stay: runs of the GPU host's
`optladder` experiment join this store's `optladder` experiment unless `--prefix` says otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

SOURCE_TAG = "optladder.source_run_id"
EXIM_RUN_ID = "mlflow_exim.run_info.run_id"  # the tool's own record of the source run, set as it imports
PARENT_TAG = "mlflow.parentRunId"


def _tool():
    try:
        from mlflow_export_import.bulk.export_experiments import export_experiments
        from mlflow_export_import.run.import_run import RunImporter
    except ImportError as e:
        raise SystemExit(f"runs_transfer needs mlflow-export-import ({e}); install it with "
                         f"pip install -e '.[transfer]' (or: pip install --no-deps mlflow-export-import)")
    return export_experiments, RunImporter


@contextlib.contextmanager
def _store(uri: str):
    """The tool finds its store through MLFLOW_TRACKING_URI (and the fluent API's URI): both set for the block."""
    import mlflow

    before_env, before_uri = os.environ.get("MLFLOW_TRACKING_URI"), mlflow.get_tracking_uri()
    os.environ["MLFLOW_TRACKING_URI"] = uri
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before_uri)
        if before_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before_env


def export_runs(uri: str, out: Path, quiet: bool = True) -> dict:
    """Every experiment of the store at `uri` (with runs) written under `out`; the tool's own summary."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    names = [e.name for e in client.search_experiments() if client.search_runs([e.experiment_id], max_results=1)]
    if not names:
        raise SystemExit(f"no experiment with runs in {uri}: nothing to export")
    # imported inside: the tool reads (and prints) the tracking URI when it is first imported
    with _store(uri), contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        export_experiments, _ = _tool()
        export_experiments(client, experiments=names, output_dir=str(out))
    done = json.loads((out / "experiments.json").read_text())
    exported = {e["name"]: e for e in done["mlflow"]["experiments"]}
    # the tool reports an experiment it could not export by leaving it out (and a run by counting it failed)
    bad = [n for n in names if n not in exported or exported[n]["failed_runs"] != 0 or exported[n]["ok_runs"] < 0]
    if bad:
        raise SystemExit(f"export from {uri} incomplete: experiment(s) {', '.join(bad)} not exported or with "
                         f"failed runs (see {out / 'experiments.json'}; run with the tool's own output: --verbose)")
    return done


def _exported(exp_dir: Path) -> dict[str, dict]:
    """run id -> its run.json content, for one exported experiment folder."""
    manifest = json.loads((exp_dir / "experiment.json").read_text())
    runs = manifest["mlflow"]["runs"]
    return {r: json.loads((exp_dir / r / "run.json").read_text())["mlflow"] for r in runs}


ARCHIVES = (".tgz", ".tar.gz")


def import_runs(src: Path, uri: str, prefix: str = "", quiet: bool = True) -> list[dict]:
    """Every exported experiment under `src` (a folder, or a gzipped tar of one) into the store at `uri`; per
    experiment: its name, runs imported, runs already there. Raises SystemExit naming what did not arrive as
    exported."""
    src = Path(src)
    if src.is_file() and src.name.endswith(ARCHIVES):
        import tarfile
        import tempfile

        with tempfile.TemporaryDirectory(prefix="optladder-import-") as tmp:
            try:
                with tarfile.open(src, "r:gz") as tar:
                    tar.extractall(tmp, filter="data")  # no paths outside tmp, no links out, no devices
            except TypeError:  # Python before 3.11.4 / 3.12 has no extraction filters
                raise SystemExit(f"{src}: unpacking an archive safely needs Python >= 3.11.4; unpack it yourself "
                                 f"and give the folder") from None
            except (tarfile.TarError, OSError, EOFError) as e:
                raise SystemExit(f"{src}: not a readable gzipped tar ({e})") from None
            tops = sorted(p.parent for p in Path(tmp).rglob("experiments.json"))
            if len(tops) != 1:
                found = ", ".join(str(p.relative_to(tmp)) for p in tops) or "none"
                raise SystemExit(f"{src} holds {len(tops)} exports (folders with an experiments.json: {found}): "
                                 f"give an archive of one folder written by `runs_transfer export`")
            return import_runs(tops[0], uri, prefix, quiet)
    if not src.is_dir():
        what = "not a folder, nor a" if src.exists() else "no such folder or"
        raise SystemExit(f"{src}: {what} {' or '.join(ARCHIVES)} archive of one written by `runs_transfer export`")
    from mlflow.tracking import MlflowClient

    from optladder.experiments.tracking import ensure_experiment, resolve_uri  # here only: export needs none of the project

    top = src / "experiments.json"
    if not top.is_file():
        raise SystemExit(f"{src} holds no experiments.json: not a folder written by `runs_transfer export` "
                         f"(or mlflow-export-import's export-experiments)")
    experiments = json.loads(top.read_text())["mlflow"]["experiments"]
    uri = resolve_uri(uri)
    with _store(uri):
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            _, RunImporter = _tool()
        client = MlflowClient(uri)
        for exp in experiments:  # with this project's artifact location rules, as run.py would create it
            ensure_experiment(client, SimpleNamespace(experiment=prefix + exp["name"], uri=uri, artifact_location=None))
        return [_import_experiment(_ExistingExperiments(client), RunImporter, src, exp, prefix, quiet)
                for exp in experiments]


class _ExistingExperiments:
    """The destination's client for mlflow-export-import 1.2, which creates the experiment of every run it imports
    and takes a tracking server's RESOURCE_ALREADY_EXISTS for "it is there": a SQL store raises another error,
    so for an experiment that exists this client answers as a server would. It also gives the run the tool
    creates the source run's start time (the tool leaves it to the clock)."""

    def __init__(self, client) -> None:
        self._client = client

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    start_time = None  # the source run's, for the run the tool creates next

    def create_run(self, experiment_id, start_time=None, tags=None, run_name=None):
        return self._client.create_run(experiment_id, start_time=start_time or self.start_time, tags=tags,
                                       run_name=run_name)

    def create_experiment(self, name: str, *args, **kwargs) -> str:
        if self._client.get_experiment_by_name(name) is not None:
            from mlflow.exceptions import RestException

            raise RestException({"error_code": "RESOURCE_ALREADY_EXISTS", "message": f"{name!r} exists"})
        return self._client.create_experiment(name, *args, **kwargs)


def _import_experiment(client, RunImporter, src: Path, exp: dict, prefix: str, quiet: bool) -> dict:
    name = prefix + exp["name"]
    runs = _exported(src / exp["id"])
    orphans = sorted({d["tags"][PARENT_TAG] for d in runs.values() if d["tags"].get(PARENT_TAG)} - set(runs))
    if orphans:  # refused before anything is imported
        raise SystemExit(f"experiment {exp['name']!r} in {src}: runs name parent run(s) {', '.join(orphans)}, "
                         f"which were not exported with them; export again from a store that holds them")
    target = client.get_experiment_by_name(name)
    if target.lifecycle_stage == "deleted":
        raise SystemExit(f"experiment {name!r} is deleted in the destination: restore it "
                         f"(mlflow experiments restore --experiment-id {target.experiment_id}) or import with "
                         f"--prefix")
    dst = {}  # source run id -> destination run id, for runs an earlier import finished
    for r in client.search_runs([target.experiment_id], filter_string=f"tags.`{EXIM_RUN_ID}` != ''",
                                max_results=50000):
        src_id = r.data.tags[EXIM_RUN_ID]
        if r.data.tags.get(SOURCE_TAG) == src_id:
            dst[src_id] = r.info.run_id
        elif src_id in runs:  # an import of this run cut short: set aside (deleted, restorable), imported again
            client.delete_run(r.info.run_id)
    already = sum(1 for r in runs if r in dst)
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        importer = RunImporter(client, import_source_tags=True, mlmodel_fix=False)
        for src_id, dct in runs.items():
            if src_id in dst:
                continue
            info = dct["info"]
            client.start_time = info.get("start_time")  # the tool creates the run without one: now
            run, _ = importer.import_run(name, str(src / exp["id"] / src_id))
            client.set_terminated(run.info.run_id, info.get("status", "FINISHED"), info.get("end_time"))
            client.set_tag(run.info.run_id, SOURCE_TAG, src_id)  # last: the mark of a finished import
            dst[src_id] = run.info.run_id
    for src_id, dct in runs.items():  # nesting, once every run of the experiment has its new id
        parent = dct["tags"].get(PARENT_TAG)
        if parent:
            client.set_tag(dst[src_id], PARENT_TAG, dst[parent])
    _check(client, runs, dst, name)
    return {"experiment": name, "runs": len(runs), "imported": len(runs) - already, "already_there": already}


def _check(client, runs: dict[str, dict], dst: dict[str, str], name: str) -> None:
    """Each exported run is in the destination with its status, params, final metrics and nesting."""
    for src_id, dct in runs.items():
        got = client.get_run(dst[src_id])
        bad = []
        if got.info.status != dct["info"].get("status", "FINISHED"):
            bad.append(f"status {got.info.status} != {dct['info'].get('status')}")
        if dict(got.data.params) != {k: str(v) for k, v in dct["params"].items()}:
            bad.append("params differ")
        if set(got.data.metrics) != set(dct["metrics"]):
            bad.append(f"metrics {sorted(set(dct['metrics']) ^ set(got.data.metrics))[:5]} missing or extra")
        parent = dct["tags"].get(PARENT_TAG)
        if parent and got.data.tags.get(PARENT_TAG) != dst[parent]:
            bad.append("not nested under its parent")
        if bad:
            raise SystemExit(f"run {src_id} of {name!r} did not arrive as exported: {'; '.join(bad)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m optladder.experiments.runs_transfer", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="write every experiment of a store as files")
    ex.add_argument("--uri", required=True, help="the store to export, e.g. sqlite:////tmp/ladder/mlflow.db")
    ex.add_argument("--out", type=Path, required=True, help="a folder to write (created)")
    ex.add_argument("--verbose", action="store_true", help="show the tool's own output")
    im = sub.add_parser("import", help="load exported experiments into a store")
    im.add_argument("src", type=Path, help="a folder written by export, or a .tgz of one")
    im.add_argument("--to", default=None, help="the destination store (default: the project's tracking.uri)")
    im.add_argument("--prefix", default="", help="prepended to every experiment name")
    a = ap.parse_args(argv)
    if a.cmd == "export":
        done = export_runs(a.uri, a.out, quiet=not a.verbose)
        exps = done["mlflow"]["experiments"]
        print(f"exported {len(exps)} experiment(s), {sum(e['ok_runs'] for e in exps)} run(s) to {a.out}")
        return 0
    uri = a.to or default_uri()
    for r in import_runs(a.src, uri, a.prefix):
        print(f"{r['experiment']}: {r['imported']} run(s) imported, {r['already_there']} already there ({uri})")
    return 0


def default_uri() -> str:
    """The project's default tracking store: optladder/conf/tracking/mlflow.yaml's uri (a relative SQLite path is the
    project's, as for run.py)."""
    from omegaconf import OmegaConf

    from optladder.paths import CONF_DIR

    return str(OmegaConf.load(CONF_DIR / "tracking" / "mlflow.yaml").uri)


if __name__ == "__main__":
    sys.exit(main())
