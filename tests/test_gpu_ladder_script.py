"""benchmarks/gpu_ladder.sh's state machine across machines, with run.py replaced by a stand-in that does what
it does to the run directory (Hydra's overrides.yaml, rungs read back from `ladder.resume_from` and one more
finished): a ladder resumed from the archive of an earlier call names its directory one past the highest,
resumes from the newest, refuses other settings, and packs the MLflow store whole and only the run directories
whose rungs are not all in the newest one."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e  # the GPU scripts run as shell processes

FAKE = f"""#!{sys.executable}
import os, shutil, sys
from pathlib import Path
args = sys.argv[1:]
if args[:1] != ["run.py"]:  # pip, the version line, the runs' export, a comparison: nothing to do
    if os.environ.get("FAKE_LOG"):
        with open(os.environ["FAKE_LOG"], "a") as f:
            f.write(" ".join(args) + "\\n")
    if "--out" in args:
        Path(args[args.index("--out") + 1]).mkdir(parents=True, exist_ok=True)
    sys.exit(0)
over = args[1:]
if os.environ.get("CUDA_VISIBLE_DEVICES", "-") == os.environ.get("FAKE_FAIL_GPU"):
    sys.exit(3)  # this GPU's ladder fails
run_dir = Path(next(a.split("=", 1)[1] for a in over if a.startswith("hydra.run.dir=")))
(run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
(run_dir / "ran_in.txt").write_text(os.getcwd() + "\\n" + os.environ.get("CUDA_VISIBLE_DEVICES", "-") + "\\n"
                                    + os.environ.get("OPTLADDER_CACHE", "-") + "\\n" + os.environ.get("OPTLADDER_DATA", "-"))
(run_dir / ".hydra" / "overrides.yaml").write_text(
    "".join(f"- {{a}}\\n" for a in over if not a.startswith("hydra.")))
store = Path(next(a for a in over if a.startswith("tracking.uri=")).split("sqlite:///", 1)[1])
store.parent.mkdir(parents=True, exist_ok=True)
with open(store, "a") as f:  # the store remembers every run that wrote to it
    f.write(run_dir.name + "\\n")
(store.parent / "mlartifacts").mkdir(exist_ok=True)
(store.parent / "mlartifacts" / run_dir.name).write_text("artifacts")
partial = os.environ.get("FAKE_PARTIAL")  # cut short: one rung read back, none finished
done = 0
for a in over:
    if a.startswith("ladder.resume_from="):
        src = Path(a.split("=", 1)[1])
        for r in sorted(src.glob("rung*-r0")):
            if (r / "summary.json").is_file() and not (partial and done):
                shutil.copytree(r, run_dir / r.name, dirs_exist_ok=True)
                done += 1
if not partial:
    for name in ("ladder.md", "ladder.json", "ladder.png"):  # what run.py writes once a ladder ends
        (run_dir / name).write_text("{{}}")
    (run_dir / f"rung{{done}}-x-r0").mkdir()
    (run_dir / f"rung{{done}}-x-r0" / "summary.json").write_text("{{}}")
(run_dir / f"rung{{done + 1}}-y-r0").mkdir()  # the rung in progress when the call ended
"""


@pytest.fixture
def fake_py(tmp_path: Path) -> Path:
    p = tmp_path / "fakepy"
    p.write_text(FAKE)
    p.chmod(0o755)
    return p


SETTINGS = ("FROM", "TS", "N", "RUNGS", "BASELINE", "EXTRA", "MODEL", "STOP_AFTER", "WAIT_S", "LADDER_S", "STATE",
            "OUT", "PY", "DEADLINE_S", "SMOKE", "COPIES", "OPTLADDER_CACHE", "CUDA_VISIBLE_DEVICES", "ONE_GPU", "AFTER",
            "AFTER_START_S", "AFTER_MAX_S", "OPTLADDER_DATA")


def call(tmp_path: Path, fake_py: Path, state: str, out: str, mode: str = "start", **env
         ) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS}  # the caller's shell decides nothing here
    e = {**clean, "SMOKE": "1", "PY": str(fake_py), "STATE": str(tmp_path / state),
         "OUT": str(tmp_path / out), "DEADLINE_S": "200", "POLL_S": "0.2", **env}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_ladder.sh"), mode], env=e, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)


def members(tgz: Path) -> set[str]:
    with tarfile.open(tgz) as t:
        return {n.split("/")[1] for n in t.getnames() if n.count("/") >= 1 and n != "."}


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
def test_resumes_across_machines_and_packs_what_the_next_needs(tmp_path, fake_py):
    r = call(tmp_path, fake_py, "m1", "o1")  # machine 1: a fresh ladder
    assert r.returncode == 0, r.stdout + r.stderr
    assert members(tmp_path / "o1" / "ladder-start.tgz") >= {"first", "mlflow", "logs"}

    # machine 2: resumes from machine 1's archive (a relative FROM, as a user gives it)
    r = call(tmp_path, fake_py, "m2", "o2", FROM="o1/ladder-start.tgz")
    assert r.returncode == 0, r.stdout + r.stderr
    args = (tmp_path / "m2" / "resume0" / ".hydra" / "overrides.yaml").read_text()
    assert f"ladder.resume_from={tmp_path / 'm2' / 'first'}" in args
    got = members(tmp_path / "o2" / "ladder-start.tgz")
    # every finished rung of first/ is in resume0/ now: first/ stays home; the store travels with its artifacts
    assert "resume0" in got and "first" not in got
    with tarfile.open(tmp_path / "o2" / "ladder-start.tgz") as t:
        names = t.getnames()
    assert "./mlflow/mlartifacts/first" in names and "./mlflow/mlartifacts/resume0" in names

    # machine 3: resumes from resume0 (the newest), into resume1
    r = call(tmp_path, fake_py, "m3", "o3", FROM="o2/ladder-start.tgz")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "m3" / "resume1" / "rung2-x-r0" / "summary.json").is_file()
    assert "ladder.resume_from=" + str(tmp_path / "m3" / "resume0") in \
        (tmp_path / "m3" / "resume1" / ".hydra" / "overrides.yaml").read_text()
    assert members(tmp_path / "o3" / "ladder-start.tgz") >= {"resume1", "mlflow"}
    assert "resume0" not in members(tmp_path / "o3" / "ladder-start.tgz")

    # machine 4: the archive holds resume1 alone; the next directory is resume2, not a second resume1
    r = call(tmp_path, fake_py, "m4", "o4", FROM="o3/ladder-start.tgz")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "m4" / "resume2" / "rung3-x-r0" / "summary.json").is_file()

    # machine 5: a resume cut short before it finished a rung of its own or read every one back: the directory
    # it resumed from still holds rungs the new one lacks, so both travel
    r = call(tmp_path, fake_py, "m5", "o5", FROM="o4/ladder-start.tgz", FAKE_PARTIAL="1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert members(tmp_path / "o5" / "ladder-start.tgz") >= {"resume2", "resume3"}


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
def test_a_second_resume_on_the_same_machine_goes_on_from_its_own_state(tmp_path, fake_py):
    assert call(tmp_path, fake_py, "m1", "o1").returncode == 0
    assert call(tmp_path, fake_py, "m2", "o2", FROM="o1/ladder-start.tgz").returncode == 0  # resume0 alone
    for _ in range(2):  # the same command twice on one machine, as after a call cut at its deadline
        r = call(tmp_path, fake_py, "m3", "o3", mode="resume", FROM="o2/ladder-start.tgz")
        assert r.returncode == 0, r.stdout + r.stderr
    # the archive was unpacked once: the store kept the first resume's run, the second went on from resume1
    assert (tmp_path / "m3" / "mlflow" / "mlflow.db").read_text().split() == ["first", "resume0", "resume1",
                                                                                "resume2"]
    assert f"ladder.resume_from={tmp_path / 'm3' / 'resume1'}" in \
        (tmp_path / "m3" / "resume2" / ".hydra" / "overrides.yaml").read_text()


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
def test_a_resume_under_other_settings_is_refused_before_anything_runs(tmp_path, fake_py):
    assert call(tmp_path, fake_py, "m1", "o1").returncode == 0
    r = call(tmp_path, fake_py, "m2", "o2", FROM="o1/ladder-start.tgz", EXTRA="seed=3")
    assert r.returncode == 2
    assert "other settings" in r.stdout and "> seed=3" in r.stdout
    assert not (tmp_path / "m2" / "resume0").exists()


def pair(tmp_path: Path, fake_py: Path, mode: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    (tmp_path / "data").mkdir(exist_ok=True)  # what a call carries (the pair copies it beside the copies)
    e = {**clean, "SMOKE": "1", "OPTLADDER_DATA": str(tmp_path / "data"), "PY": str(fake_py), "COPIES": str(tmp_path / "m"), "OUT": str(tmp_path / "o"),
         "DEADLINE_S": "200", "POLL_S": "0.2", "OPTLADDER_CACHE": str(tmp_path / "cache"),
         "FAKE_LOG": str(tmp_path / "fake.log"), **env}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_ladder_pair.sh"), mode], env=e, cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(shutil.which("setsid") is None or shutil.which("git") is None, reason="needs setsid and git")
def test_a_pair_runs_two_copies_each_on_its_own_gpu_state_and_cache(tmp_path, fake_py):
    """benchmarks/gpu_ladder_pair.sh: two copies of the checkout (its files only), each ladder on its own GPU with
    its own ladder directory, store and model cache; both archives come back, at most 8 files in all, and the two
    ladders are compared once both ended. (A real pair of tiny ladders on this CPU: the results README.)"""
    r = pair(tmp_path, fake_py, "start")
    assert r.returncode == 0, r.stdout + r.stderr
    m = tmp_path / "m"
    for i, gpu in (("a", "0"), ("b", "1")):
        copy = m / f"copy-{i}"
        assert (copy / "run.py").is_file() and (copy / "benchmarks" / "gpu_ladder_pair.sh").is_file()
        assert not (copy / ".venv").exists() and not (copy / ".git").exists()  # the checkout's files only
        ran_in = (m / f"optladder-ladder-{i}" / "first" / "ran_in.txt").read_text().split("\n")
        assert ran_in[:3] == [str(copy), gpu, str(tmp_path / "cache" / f"cache-{i}")]
        assert members(tmp_path / "o" / i / "ladder-start.tgz") >= {"first", "mlflow", "logs"}
        assert f"== copy {i} (GPU {gpu}): exit status 0" in r.stdout
    compared = [line for line in (tmp_path / "fake.log").read_text().splitlines() if "ladder_compare" in line]
    assert compared == [f"-m optladder.experiments.ladder_compare {m}/optladder-ladder-a/first {m}/optladder-ladder-b/first"]
    back = [f for f in (tmp_path / "o").rglob("*") if f.is_file()]
    assert len(back) <= 8, back  # what a device call brings back
    assert "comparison" in (tmp_path / "o" / "status.txt").read_text()
    # a second start while both still ran would be refused; a wait polls both again and compares again
    r = pair(tmp_path, fake_py, "wait")
    assert r.returncode == 0, r.stdout + r.stderr
    r = pair(tmp_path, fake_py, "wait", COPIES=str(tmp_path / "nothing"))
    assert r.returncode == 2 and "start' first" in r.stdout


@pytest.mark.skipif(shutil.which("setsid") is None or shutil.which("git") is None, reason="needs setsid and git")
def test_a_pair_whose_copy_fails_says_which_and_exits_with_its_status(tmp_path, fake_py):
    r = pair(tmp_path, fake_py, "start", FAKE_FAIL_GPU="1")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "== copy a (GPU 0): exit status 0" in r.stdout and "copy b ended with exit status 3" in r.stdout


@pytest.mark.skipif(shutil.which("setsid") is None or shutil.which("git") is None, reason="needs setsid and git")
def test_one_gpu_runs_the_two_copies_one_after_the_other_on_gpu_0(tmp_path, fake_py):
    """ONE_GPU=1 (a one-GPU machine): both copies on GPU 0, copy b's run.py started only once copy a's ladder had
    written its exit status, in a later call, after the carried data was gone; then compared as a pair on two GPUs
    is, and a `wait` without ONE_GPU=1 still knows the mode."""
    # copy a's stand-in run.py takes a while: b starting at once would write its directory before a's rc exists
    slow = tmp_path / "slowpy"
    slow.write_text(f"#!/usr/bin/env bash\n[ \"$1\" = run.py ] && [ \"$STATE\" = {tmp_path}/m/optladder-ladder-a ]"
                    f" && sleep 6\nexec {fake_py} \"$@\"\n")
    slow.chmod(0o755)
    m = tmp_path / "m"
    # an earlier pair's ladder a: its exit status must not start b (the pair clears it; so does copy a's own start,
    # which usually comes first: this does not catch the race, only that the stale state does no harm)
    (m / "optladder-ladder-a").mkdir(parents=True)
    (m / "optladder-ladder-a" / "rc").write_text("0")
    data = tmp_path / "carried-data"  # what the `start` call carried: gone by the next call, on a device machine
    (data / "traces").mkdir(parents=True)
    (data / "traces" / "t.csv").write_text("x")
    r = pair(tmp_path, slow, "start", ONE_GPU="1", OPTLADDER_DATA=str(data), WAIT_S="1")
    assert r.returncode == 124, r.stdout + r.stderr  # the call returned while both were still to end
    assert not (m / "optladder-ladder-b" / "first").exists()
    shutil.rmtree(data)
    r = pair(tmp_path, slow, "wait")  # no ONE_GPU here
    assert r.returncode == 0, r.stdout + r.stderr
    for i in ("a", "b"):
        ran_in = (m / f"optladder-ladder-{i}" / "first" / "ran_in.txt").read_text().split("\n")
        assert ran_in[1] == "0" and ran_in[3] == str(m / "optladder-data")
        assert f"== copy {i} (GPU 0): exit status 0" in r.stdout
    assert (m / "optladder-data" / "traces" / "t.csv").read_text() == "x"
    a_ended = (m / "optladder-ladder-a" / "rc").stat().st_mtime_ns
    b_began = (m / "optladder-ladder-b" / "first" / ".hydra").stat().st_mtime_ns
    assert b_began >= a_ended
    assert "AFTER" not in (m / "optladder-ladder-a" / "run.sh").read_text()
    assert str(m / "optladder-ladder-a") in (m / "optladder-ladder-b" / "run.sh").read_text()
    compared = [line for line in (tmp_path / "fake.log").read_text().splitlines() if "ladder_compare" in line]
    assert len(compared) == 1


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
def test_a_ladder_after_one_that_never_starts_gives_up(tmp_path, fake_py):
    r = call(tmp_path, fake_py, "s", "o", AFTER=str(tmp_path / "nothing-here"), AFTER_START_S="1", WAIT_S="20")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "no ladder started there in 1s" in (tmp_path / "s" / "logs" / "first.log").read_text()
    assert not (tmp_path / "s" / "first").exists()  # run.py never ran


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_pair_without_its_data_is_refused_before_anything_is_removed(tmp_path, fake_py):
    earlier = tmp_path / "m" / "optladder-ladder-a" / "first"  # an earlier pair's finished ladder
    earlier.mkdir(parents=True)
    r = pair(tmp_path, fake_py, "start", OPTLADDER_DATA=str(tmp_path / "not-carried"))
    assert r.returncode == 2 and "no data at" in r.stdout and "not-carried" in r.stdout
    assert earlier.is_dir() and not (tmp_path / "m" / "optladder-pair-mode").exists()


def test_after_s_limits_must_be_whole_seconds(tmp_path, fake_py):
    r = call(tmp_path, fake_py, "s", "o", AFTER=str(tmp_path), AFTER_START_S="1.5")
    assert r.returncode == 2 and "AFTER_START_S=1.5: whole seconds" in r.stdout
