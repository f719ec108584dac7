"""engine=vllm as the engine under test: vLLM missing from its interpreter, or a switch it cannot run here, is one
line and exit 3 before any data loads or server starts; a server that fails to start leaves its log where it was
asked to and no process behind; and `+ladder=vllm` on the CPU (slow, needs .venv-vllm) ends with every rung decided,
or refused before its server started, naming the switch, the version and why."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

from optladder.backends.vllm_env import VLLMInstall, check_install, check_switches, cpu_flags, probe, unsupported
from optladder.engine.config import EngineConfig, ModelConfig, ServerConfig, SpeculativeConfig
from optladder.experiments.errors import USER_ERROR_EXIT

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
FAST = ["replay.progress=false", "engine.max_model_len=1024", "tracking.system_metrics=false", "tracking.enabled=false",
        "quality.max_new_tokens=8", "workload.rate=20", "workload.num_requests=4", "quality.num_prompts=3"]
# model=tiny with a head dim vLLM's CPU attention takes (its own, 16, is refused as `the model`)
TINY32 = ["model=tiny", "model.hidden_size=128", "model.head_dim=32"]
NO_AVX = frozenset({"sse4_2", "avx2", "fma"})  # a CPU like this test machine's: no AVX-512, no AMX


def run(args: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPTLADDER_CACHE": os.environ.get("OPTLADDER_CACHE", str(ROOT / ".cache")), **(env or {})}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def errors(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith("optladder: error:")]


def fake_vllm_python(tmp_path: Path, version: str = "0.32.0+cpu", server: str = "import sys; sys.exit(3)") -> Path:
    """An interpreter that answers the preflight's probe (`python -c PROBE`) as one with vLLM `version` would,
    and runs `server` (a Python body) for anything else, i.e. `vllm_cli.py serve ...`; every such start leaves a
    line in started.txt."""
    script = tmp_path / "fake_server.py"
    script.write_text(server)
    started = tmp_path / "started.txt"
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nif [ \"$1\" = \"-c\" ]; then echo '{json.dumps({'version': version})}'; exit 0; fi\n"
                   f"echo \"$@\" >> {started}\nshift\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def assert_gone(pid: int, within_s: float = 20.0) -> None:
    """The process `pid` (a server's child) ends within `within_s`: gone, or a zombie awaiting its parent."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and psutil.pid_exists(pid) and \
            psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.2)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# --- vLLM missing from the interpreter that would run it ---

def test_an_interpreter_without_vllm_is_refused_in_one_line_before_anything_runs(tmp_path):
    """The issue's new user: engine.server.python is a Python without vLLM (here: this project's own .venv)."""
    t0 = time.monotonic()
    out = tmp_path / "out"
    p = run(["engine=vllm", *TINY32, *FAST, f"engine.server.python={sys.executable}", f"hydra.run.dir={out}"])
    took = time.monotonic() - t0
    assert p.returncode == USER_ERROR_EXIT, p.stderr[-2000:]
    [line] = errors(p.stderr)
    assert line == (f"optladder: error: engine=vllm: engine.server.python={sys.executable} cannot import vllm "
                    "(ModuleNotFoundError: No module named 'vllm'): run `make vllm-env` (vLLM for CPUs in .venv-vllm, "
                    "the default) or set engine.server.python=/path/to/python of an environment with vLLM")
    assert "Traceback" not in p.stderr and "starting vLLM" not in p.stdout + p.stderr
    assert "data checked" not in p.stdout + p.stderr  # the preflight's data checks did not run either
    assert not list(out.rglob("config_snapshot.json")) and not list(out.rglob("requests.jsonl"))
    assert took < 60, took


def test_a_missing_interpreter_and_the_default_are_named():
    srv = ServerConfig(python="/nowhere/bin/python")
    install = probe(srv.python)
    assert not install.ok and install.error == "no such file"
    with pytest.raises(ValueError, match=r"^engine=vllm: engine.server.python=/nowhere/bin/python cannot import vllm "
                                         r"\(no such file\): run `make vllm-env`"):
        check_install(install, srv)
    default = VLLMInstall(sys.executable, None, "ModuleNotFoundError: No module named 'vllm'")
    with pytest.raises(ValueError, match=rf"the default interpreter {sys.executable} \(engine.server.python=null; "
                                         r"/x/.venv-vllm/bin/python does not exist, so the default is this interpreter"
                                         r"\) cannot import vllm"):
        check_install(default, ServerConfig(), "/x/.venv-vllm/bin/python")
    check_install(VLLMInstall("/y/python", "0.32.0"), ServerConfig())  # found: nothing to say


def test_the_probe_looks_where_the_server_will_with_its_env(tmp_path):
    """A vLLM found only on engine.server.env's PYTHONPATH (an unpacked bundle, as on the GPU machine) is found by
    the preflight's probe as it is by the server started with that env; without the env it is not there."""
    from optladder.experiments.preflight import check_vllm_install

    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm-9.9.9.dist-info").mkdir()
    (site / "vllm-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    bare = probe(sys.executable)
    assert not bare.ok and "No module named 'vllm'" in bare.error
    env = {"PYTHONPATH": str(site)}
    assert probe(sys.executable, env).version == "9.9.9"
    engine = EngineConfig(name="vllm", server=ServerConfig(python=sys.executable, env=env))
    assert check_vllm_install(engine).version == "9.9.9"
    with pytest.raises(ValueError, match="cannot import vllm"):
        check_vllm_install(EngineConfig(name="vllm", server=ServerConfig(python=sys.executable)))


@pytest.mark.skipif(not VLLM_PY.exists(), reason="vLLM not installed in .venv-vllm")
def test_the_probe_finds_the_cpu_wheel_and_its_version():
    install = probe(str(VLLM_PY))
    assert install.ok and install.version.endswith("+cpu") and install.version[0].isdigit(), install


# --- a switch this vLLM cannot run here ---
def vcfg(**kw) -> EngineConfig:
    return EngineConfig(name="vllm", block_size=kw.pop("block_size", 128), **kw)


def test_what_vllms_cpu_platform_cannot_run_is_named_with_its_reason():
    everything = vcfg(fused_kernels=True, cuda_graphs=True, piecewise_graphs=True, chunked_prefill=True,
                      prefix_cache=True, speculative=SpeculativeConfig("ngram"), kv_fp8=True, quant_fp8=True)
    got = dict(unsupported(everything, 64, "cpu", NO_AVX, compiler=True))
    assert set(got) == {"cuda_graphs", "piecewise_graphs", "kv_fp8", "quant_fp8"}
    assert "AVX-512 or AMX" in got["kv_fp8"] and "AMX tiles" in got["quant_fp8"]
    # a CPU with AVX-512 keeps an FP8 KV cache (for head dims divisible by 32); FP8 weights need AMX
    assert dict(unsupported(vcfg(kv_fp8=True, quant_fp8=True), 64, "cpu", NO_AVX | {"avx512f"})).keys() == {"quant_fp8"}
    assert unsupported(vcfg(kv_fp8=True, quant_fp8=True), 64, "cpu", NO_AVX | {"avx512f", "amx_tile"}) == []
    assert "divisible by 32" in dict(unsupported(vcfg(kv_fp8=True), 80, "cpu", NO_AVX | {"avx512f"}))["kv_fp8"]
    assert "no C++ compiler" in dict(unsupported(vcfg(fused_kernels=True), 64, "cpu", NO_AVX, compiler=False))[
        "fused_kernels"]
    assert [o for o, _ in unsupported(vcfg(), 16, "cpu", NO_AVX)] == ["model"]  # model=tiny's head dim
    # on CUDA: piecewise graphs need vLLM's compiled graph (it would turn them into FULL silently)
    assert [o for o, _ in unsupported(vcfg(cuda_graphs=True, piecewise_graphs=True), 64, "cuda")] == ["piecewise_graphs"]
    assert unsupported(vcfg(fused_kernels=True, cuda_graphs=True, piecewise_graphs=True, kv_fp8=True), 64, "cuda") == []
    with pytest.raises(ValueError, match=r"^engine=vllm cannot run this here \(vLLM 0\.32\.0\+cpu on cpu\): opt kv_fp8: "
                                         r"vLLM's CPU attention keeps an FP8 KV cache on x86 with AVX-512 or AMX only; "
                                         r"this CPU has neither\. drop \+opt=kv_fp8 or run on a GPU"):
        check_switches(vcfg(kv_fp8=True), 64, "cpu", "0.32.0+cpu", NO_AVX)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n\nprocessor\t: 1\nflags\t\t: fpu sse avx2 avx512f\n")
    assert cpu_flags(str(f)) == {"fpu", "sse", "avx2", "avx512f"}
    assert cpu_flags(str(tmp_path / "none")) == frozenset()


def test_an_unsupported_switch_is_refused_before_the_server_starts(tmp_path):
    """run.py engine=vllm +opt=cuda_graphs on a CPU: refused with the switch, the probed version and why, and the
    interpreter never ran `vllm serve`."""
    py = fake_vllm_python(tmp_path, version="0.32.0+cpu")
    p = run(["engine=vllm", *TINY32, *FAST, "engine.device=cpu", f"engine.server.python={py}", "+opt=cuda_graphs",
             f"hydra.run.dir={tmp_path / 'out'}"])
    assert p.returncode == USER_ERROR_EXIT, p.stderr[-2000:]
    [line] = errors(p.stderr)
    assert line.startswith("optladder: error: engine=vllm cannot run this here (vLLM 0.32.0+cpu on cpu): opt "
                           "cuda_graphs: vLLM's CPU platform captures no CUDA graphs"), line
    assert line.endswith("drop +opt=cuda_graphs or run on a GPU (engine.device=cuda)"), line
    assert not (tmp_path / "started.txt").exists()  # `vllm serve` never ran


def test_the_vllm_ladders_rungs_are_vllms_switches_and_each_maps():
    from optladder.backends.vllm_args import SUPPORTED

    rungs = yaml.safe_load((ROOT / "optladder" / "conf" / "ladder" / "vllm.yaml").read_text())["rungs"]
    assert set(rungs) <= set(SUPPORTED) and len(set(rungs)) == len(rungs)
    assert {"fused_kernels", "cuda_graphs", "chunked_prefill", "prefix_cache", "speculative", "kv_fp8",
            "quant_fp8"} <= set(rungs)
    assert rungs.index("fused_kernels") < rungs.index("cuda_graphs") < rungs.index("piecewise_graphs")


def fake_server_configs(py: Path) -> tuple[ModelConfig, EngineConfig]:
    """A tiny random model with vLLM's CPU head dim, and engine=vllm served by the fake interpreter `py`."""
    model = ModelConfig(name="tiny_hd32", source="random", tokenizer="smollm2", vocab_size=49152, hidden_size=128,
                        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32)
    engine = EngineConfig(name="vllm", block_size=128, device="cpu", max_model_len=1024,
                          server=ServerConfig(python=str(py), port=0, startup_timeout_s=60))
    return model, engine


# --- a server that fails to start ---
def test_a_failed_start_leaves_its_log_in_the_given_directory_and_no_process(tmp_path):
    from optladder.backends import make_backend
    from optladder.backends.launcher import ServerStartError

    pidfile = tmp_path / "child.pid"
    body = textwrap.dedent(f'''
        import subprocess, sys
        child = subprocess.Popen(["sleep", "600"])  # a process of the server's own, as vLLM's engine core
        open({str(pidfile)!r}, "w").write(str(child.pid))
        print("loading weights", flush=True)
        print("RuntimeError: no device found", flush=True)
        sys.exit(3)
    ''')
    py = fake_vllm_python(tmp_path, server=body)
    model, engine = fake_server_configs(py)
    run_dir = tmp_path / "run"
    with pytest.raises(ServerStartError, match=r"(?s)exited with status 3.*no device found"):
        make_backend(model, engine, log_dir=run_dir)
    [log] = list(run_dir.glob("vllm-*.log"))
    assert "loading weights" in log.read_text() and "no device found" in log.read_text()
    assert_gone(int(pidfile.read_text()))


def test_servers_launched_without_waiting_start_together(tmp_path):
    """make_backend(..., wait=False) launches `vllm serve` and returns; wait_ready() then waits for it. Two servers
    launched that way (a switchback's arms, the teacher-forced pair) come up together: the second was started
    before the first answered, not a whole start-up later. The fake server takes UP_S to answer /health."""
    from optladder.backends import make_backend

    up_s = 4.0
    starts = tmp_path / "starts.txt"
    body = textwrap.dedent(f'''
        import http.server, sys, time
        with open({str(starts)!r}, "a") as f:
            f.write(f"{{time.time()}}\\n")
        time.sleep({up_s})
        port = int(sys.argv[sys.argv.index("--port") + 1])

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"")

            def log_message(self, *a):
                pass

        http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    ''')
    py = fake_vllm_python(tmp_path, server=body)
    model, engine = fake_server_configs(py)
    a = make_backend(model, engine, log_dir=tmp_path / "a", wait=False)
    try:
        b = make_backend(model, engine, log_dir=tmp_path / "b", wait=False)
        try:
            assert a.start_s is None and b.start_s is None  # launched, not awaited
            a.wait_ready()
            b.wait_ready()
            t_a, t_b = (float(x) for x in starts.read_text().split())
            assert t_b - t_a < 0.75 * up_s, (t_a, t_b)  # b was launched before a could answer
            assert a.start_s >= up_s and b.start_s >= up_s
            pids = [a.server.process.proc.pid, b.server.process.proc.pid]
        finally:
            b.close()
    finally:
        a.close()
    for pid in pids:
        assert_gone(pid)


def test_a_run_whose_server_fails_to_start_is_marked_failed_with_the_servers_log(tmp_path):
    """run_experiment(engine=vllm) whose `vllm serve` exits at start: the run is FAILED in MLflow, its error.txt
    holds the server's exit status and log tail, and no process of the server is left."""
    from conftest import compose_config
    from mlflow.tracking import MlflowClient

    from optladder.backends.launcher import ServerStartError
    from optladder.experiments.experiment import run_experiment

    pidfile = tmp_path / "child.pid"
    body = textwrap.dedent(f'''
        import subprocess, sys
        child = subprocess.Popen(["sleep", "600"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        print("ValueError: fake vllm cannot load this model", flush=True)
        sys.exit(1)
    ''')
    py = fake_vllm_python(tmp_path, server=body)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_config(["engine=vllm", *TINY32[1:], "model.name=tiny_hd32", "engine.device=cpu",
                          f"engine.server.python={py}", "engine.server.startup_timeout_s=60", f"tracking.uri={uri}"])
    out = tmp_path / "run"
    with pytest.raises(ServerStartError, match=r"(?s)exited with status 1.*fake vllm cannot load this model"):
        run_experiment(cfg, out)
    assert "fake vllm cannot load this model" in (out / "error.txt").read_text()
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("optladder").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert_gone(int(pidfile.read_text()))


# --- +ladder=vllm on the CPU, end to end ---
def _marked(mark: str) -> list[psutil.Process]:
    """Processes whose environment carries the run's mark: the server and everything it started, renamed
    ones (VLLM::EngineCore, VLLM::Worker) too."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("OPTLADDER_TEST_MARK") == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


LADDER = yaml.safe_load((ROOT / "optladder" / "conf" / "ladder" / "vllm.yaml").read_text())["rungs"]
# the ladder in two halves, each from its own baseline, so that each test stays near 3 minutes on 2 cores (a
# server's start is about a minute there); the whole ladder in one command took 6.3 min
HALVES = {"compile-graphs-chunks": LADDER[:len(LADDER) // 2], "cache-spec-fp8": LADDER[len(LADDER) // 2:]}


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(not VLLM_PY.exists(), reason="vLLM not installed in .venv-vllm")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("half", list(HALVES))
def test_the_vllm_ladder_on_the_cpu_decides_or_explains_every_rung(tmp_path, half):
    """Every rung that vLLM for CPUs runs here ends decided (pass, fail, inconclusive: a verdict with its gates,
    the near-tie check over vLLM's log-probs among them); every other one is left out before a server starts, its
    reason naming the switch, the version and why. A tiny budget: 4 requests, 3 quality prompts of 8 tokens.
    VLLM_CPU_CI_ENV=1 (vLLM's own CI switch) traces the compiled rung with Dynamo but runs it eagerly: Inductor's
    C++ build would add a minute a server here."""
    from optladder.backends.vllm_env import probe as probe_vllm

    rungs = HALVES[half]
    mark = uuid.uuid4().hex
    out = tmp_path / "ladder"
    t0 = time.monotonic()
    p = run(["engine=vllm", "+ladder=vllm", f"ladder.rungs=[{','.join(rungs)}]", "model=smollm2_135m", *FAST,
             "engine.kv_cache_gb=1", "engine.device=cpu", "+engine.server.env.VLLM_CPU_CI_ENV='1'",
             f"hydra.run.dir={out}"], env={"OPTLADDER_TEST_MARK": mark}, timeout=850)
    took = time.monotonic() - t0
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-5000:])
    report = json.loads((out / "ladder.json").read_text())
    assert report["complete"] and report["planned"] == rungs and report["ladder"] == "vllm"
    rows = {r["opt"]: r for r in report["rungs"][1:]}
    assert list(rows) == rungs and report["rungs"][0]["status"] == "baseline"
    version = probe_vllm(str(VLLM_PY)).version
    ran = []
    for opt, row in rows.items():
        engine = vcfg(**{o: (SpeculativeConfig("ngram") if o == "speculative" else True) for o in row["opts"]})
        why = dict(unsupported(engine, 64, "cpu"))  # this CPU's own flags: kv_fp8 runs where it has AVX-512
        if why:
            assert row["status"] == "error", (opt, row)
            bad = next(iter(why))
            assert f"opt {bad}: {why[bad]}" in row["reason"] and f"vLLM {version} on cpu" in row["reason"], row
            continue
        assert row["status"] in ("pass", "fail", "inconclusive"), (opt, row)
        gates = {g["gate"]: g for g in row["verdict"]["gates"]}
        assert row["verdict"]["status"] == row["status"] and gates, row
        if opt not in ("kv_fp8", "quant_fp8"):  # lossless: the near-tie check had vLLM's top-k log-probs
            assert gates["near_tie"]["status"] in ("pass", "fail"), gates["near_tie"]
        ran.append(opt)
    assert set(ran) >= set(rungs) & {"fused_kernels", "chunked_prefill", "prefix_cache", "speculative"}, rows
    # a server for the baseline and each rung that ran (twice more for a lossy one, scored teacher-forced), none
    # for the others
    lossy = sum(o in ("kv_fp8", "quant_fp8") for o in ran)
    assert (p.stdout + p.stderr).count("vllm: started pid") == 1 + len(ran) + 2 * lossy
    assert _marked(mark) == []  # no process of any of the ladder's servers is left
    print(f"vLLM ladder ({half}) on the CPU: {took:.0f} s, {1 + len(ran)} servers")
