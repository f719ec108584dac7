"""The engine adapters: vLLM's opt mapping (pure), its launcher's guards (port in use, a failed start, no
orphan after an interrupt) against small fake servers, the HF adapter's greedy outputs against the
reference engine, and vLLM end to end with SmolLM2 (slow; skipped where .venv-vllm is absent)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from optladder.backends.launcher import ServerStartError, port_in_use
from optladder.backends.opt_map import ALWAYS_ON, FIXED, MAPPED, refuse_unmapped
from optladder.backends.vllm_args import SUPPORTED, build_launch
from optladder.engine.config import EngineConfig, ModelConfig, ServerConfig

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
def needs_vllm(test):
    """vLLM for CPUs in .venv-vllm (make vllm-env): marked `vllm`, skipped where it is absent."""
    return pytest.mark.vllm(pytest.mark.skipif(not VLLM_PY.exists(), reason="vLLM not installed in .venv-vllm")(test))


def launch(device: str = "cpu", **kw):
    cfg = EngineConfig(name="vllm", block_size=kw.pop("block_size", 128), **kw)
    return build_launch(cfg, device, "/models/smol", "smol", "127.0.0.1", 8123)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# --- vLLM: each opt onto vLLM's own arguments ---
def test_baseline_on_cpu_maps_every_field_and_reports_what_vllm_cannot_switch_off():
    L = launch(max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=1024, kv_cache_gb=2.0)
    a = L.args
    assert a[0] == "/models/smol"
    assert [flag(a, f) for f in ("--block-size", "--max-num-seqs", "--max-num-batched-tokens")] == ["128", "8", "4096"]
    assert (flag(a, "--dtype"), flag(a, "--max-model-len"), flag(a, "--port")) == ("float32", "1024", "8123")
    assert "--no-enable-prefix-caching" in a and "--enable-prefix-caching" not in a  # vLLM's default is on
    assert L.env == {"VLLM_CPU_KVCACHE_SPACE": "2"} and "--kv-cache-memory-bytes" not in a
    eff = L.opts_effective
    for opt in ("paged_kv", "dynamic_batching", "batched_decode"):  # on although our config says off
        assert eff[opt]["state"] == ALWAYS_ON and eff[opt]["on"] is True and eff[opt]["requested"] is False
    assert eff["flash_attn"]["state"] == ALWAYS_ON and eff["flash_attn"]["backend"] == "CPU_ATTN"
    assert eff["cuda_graphs"] == {**eff["cuda_graphs"], "state": FIXED, "on": False}
    assert eff["prefix_cache"]["state"] == MAPPED and eff["prefix_cache"]["on"] is False
    assert set(eff) == set(SUPPORTED)


def test_prefix_cache_on_is_passed_to_vllm():
    L = launch(paged_kv=True, prefix_cache=True)
    assert "--enable-prefix-caching" in L.args and "--no-enable-prefix-caching" not in L.args
    assert L.opts_effective["prefix_cache"]["on"] is True and L.opts_effective["paged_kv"]["requested"] is True


@pytest.mark.parametrize("on", [False, True])
def test_cuda_maps_attention_backend_and_cuda_graphs_both_ways(on):
    L = launch("cuda", flash_attn=on, cuda_graphs=on, block_size=16)
    assert flag(L.args, "--attention-backend") == ("FLASH_ATTN" if on else "TRITON_ATTN")
    mode = json.loads(flag(L.args, "--compilation-config"))["cudagraph_mode"]
    assert mode == ("FULL_DECODE_ONLY" if on else "NONE")
    assert flag(L.args, "--dtype") == "bfloat16"  # our auto on CUDA, not the checkpoint's float32
    assert flag(L.args, "--kv-cache-memory-bytes") == str(1 << 30) and L.env == {}
    assert L.opts_effective["flash_attn"]["on"] is on and L.opts_effective["cuda_graphs"]["on"] is on


def test_an_exact_kv_size_on_a_gpu_leaves_room_for_a_second_server():
    """With --kv-cache-memory-bytes vLLM still refuses to start unless free memory >= gpu_memory_utilization x
    total (0.9 by default), which a second server on the same GPU (a switchback's other arm) never meets: the
    launch asks for the shared fraction instead, unless the user set the flag; on the CPU nothing is added."""
    from optladder.backends.vllm_args import SHARED_GPU_FRACTION

    L = launch("cuda", kv_cache_gb=4.0, block_size=16)
    assert L.args.count("--gpu-memory-utilization") == 1
    assert float(flag(L.args, "--gpu-memory-utilization")) == SHARED_GPU_FRACTION < 0.5
    own = launch("cuda", kv_cache_gb=4.0, block_size=16,
                 server=ServerConfig(extra_args=["--gpu-memory-utilization", "0.7"]))
    assert own.args.count("--gpu-memory-utilization") == 1 and own.args[-2:] == ["--gpu-memory-utilization", "0.7"]
    assert "--gpu-memory-utilization" not in launch("cpu", kv_cache_gb=0.5).args


def test_piecewise_graphs_map_to_vllms_full_and_piecewise_mode():
    L = launch("cuda", flash_attn=True, cuda_graphs=True, piecewise_graphs=True, block_size=16)
    assert json.loads(flag(L.args, "--compilation-config"))["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert L.opts_effective["piecewise_graphs"]["on"] is True
    assert L.args.count("--compilation-config") == 1


@pytest.mark.parametrize("on", [False, True])
def test_chunked_prefill_maps_both_ways(on):
    L = launch("cuda", paged_kv=True, dynamic_batching=True, chunked_prefill=on, block_size=16)
    assert ("--enable-chunked-prefill" in L.args) == on and ("--no-enable-chunked-prefill" in L.args) != on
    eff = L.opts_effective
    assert eff["chunked_prefill"]["state"] == MAPPED and eff["chunked_prefill"]["on"] is on


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("fused", [False, True])
def test_fused_kernels_is_torch_compile_both_ways_in_one_compilation_config(device, fused):
    """Off: vLLM eager (compilation mode NONE); on: vLLM's own default (torch.compile), the ladder's second rung."""
    graphs = device == "cuda"
    L = launch(device, fused_kernels=fused, cuda_graphs=graphs, block_size=16 if graphs else 128)
    eff = L.opts_effective["fused_kernels"]
    assert eff["state"] == MAPPED and eff["on"] is fused and eff["requested"] is fused
    assert L.args.count("--compilation-config") == (1 if graphs or not fused else 0)
    cc = json.loads(flag(L.args, "--compilation-config")) if "--compilation-config" in L.args else {}
    assert ("mode" in cc) is not fused and cc.get("mode", "NONE") == "NONE"
    assert cc.get("cudagraph_mode") == ("FULL_DECODE_ONLY" if graphs else None)
    with pytest.raises(ValueError, match=r"no mapping for opt\(s\) \['skinny_gemm'\]"):
        launch("cuda", fused_kernels=True, skinny_gemm=True, block_size=16)


def test_kv_budget_exact_bytes_fractions_and_user_overrides():
    L = launch(kv_cache_gb=0.5)  # not whole GiB: the CPU variable cannot say it, and must not override it
    assert flag(L.args, "--kv-cache-memory-bytes") == str(1 << 29) and L.env["VLLM_CPU_KVCACHE_SPACE"] == ""
    L = launch(kv_cache_gb=None, kv_cache_memory_fraction=0.3)
    assert flag(L.args, "--gpu-memory-utilization") == "0.3"
    L = launch(server=ServerConfig(extra_args=["--enforce-eager", "--max-num-seqs", "2"], env={"X": "1"}))
    assert L.args[-3:] == ["--enforce-eager", "--max-num-seqs", "2"] and L.env["X"] == "1"  # last: theirs win


def test_settings_vllm_cannot_run_are_refused_before_start():
    with pytest.raises(ValueError, match=r"block_size=16.*multiple of 32"):
        launch(block_size=16)
    with pytest.raises(ValueError, match="cuda_graphs.*CUDA"):
        launch(cuda_graphs=True)
    with pytest.raises(ValueError, match=r"engine=vllm has no mapping for opt\(s\) \['skinny_gemm'\]; it supports "
                                         r"\['batched_decode', 'chunked_prefill', 'cuda_graphs'"):
        refuse_unmapped("vllm", ["paged_kv", "skinny_gemm"], SUPPORTED)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_speculative_ngram_maps_to_vllms_speculative_config_and_the_rest_is_refused(device):
    from optladder.engine.config import SpeculativeConfig

    off = launch(device, block_size=128)
    assert "--speculative-config" not in off.args and off.opts_effective["speculative"]["on"] is False
    spec = SpeculativeConfig("ngram", num_draft_tokens=5, ngram_max=4, ngram_min=2)
    on = launch(device, block_size=128, speculative=spec)
    assert json.loads(flag(on.args, "--speculative-config")) == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert on.opts_effective["speculative"]["on"] is True and on.opts_effective["speculative"]["requested"] is True
    with pytest.raises(ValueError, match=r"engine.speculative.method='draft_layers' has no vLLM equivalent.*method=ngram"):
        launch(device, block_size=128, speculative=SpeculativeConfig("draft_layers"))
    with pytest.raises(ValueError, match=r"engine.speculative.disable_by_batch_size=8: vLLM has no such switch"):
        launch(device, block_size=128, speculative=SpeculativeConfig("ngram", disable_by_batch_size=8))


def test_hf_refuses_graphs_without_its_continuous_batching_and_couples_paged_kv():
    from optladder.backends.hf import opt_mappings

    with pytest.raises(ValueError, match=r"engine=hf.*dynamic_batching,cuda_graphs"):
        opt_mappings(EngineConfig(name="hf", cuda_graphs=True), "cuda")
    eff = {m.opt: m for m in opt_mappings(EngineConfig(name="hf", paged_kv=True), "cpu")}
    assert eff["dynamic_batching"].on and not eff["dynamic_batching"].requested  # coupled, and said so
    from optladder.engine.config import SpeculativeConfig

    with pytest.raises(ValueError, match=r"engine=hf has no mapping for opt\(s\) \['speculative'\]"):
        opt_mappings(EngineConfig(name="hf", speculative=SpeculativeConfig("ngram")), "cpu")


def test_openai_records_opts_as_metadata_with_a_warning(tmp_path):
    from optladder.backends.openai_endpoint import OpenAIEndpoint
    from optladder.serving.server import serve
    from test_server import tiny_engine

    with serve(tiny_engine(), model_name="tiny") as handle:
        cfg = EngineConfig(name="openai", paged_kv=True, server=ServerConfig(base_url=handle.url + "/v1",
                                                                             served_model_name="tiny"))
        ep = OpenAIEndpoint(ModelConfig(name="tiny"), cfg)
        eff = ep.opts_effective()
        assert eff["paged_kv"]["on"] is None and eff["paged_kv"]["requested"] is True
        assert "DESCRIBE" in eff["flash_attn"]["warning"]
        assert len(ep.generate([[1, 2, 3, 4]], 3, concurrency=2, progress=False)) == 1
        with pytest.raises(ValueError, match=r"'nope' is not served.*\['tiny'\]"):
            OpenAIEndpoint(ModelConfig(), replace(cfg, server=replace(cfg.server, served_model_name="nope")))


@needs_vllm
def test_vllms_own_parser_accepts_our_arguments():
    """Flag names move between vLLM versions: the installed vLLM parses what we build, or this fails."""
    from optladder.engine.config import SpeculativeConfig

    tp2 = build_launch(EngineConfig(name="vllm", server=ServerConfig(tensor_parallel_size=2)), "cuda", "/models/s",
                       "s", "127.0.0.1", 8123, ["--load-format", "dummy"])  # a 70B shape on two GPUs
    sets = [launch().args, launch("cuda", flash_attn=True, cuda_graphs=True, block_size=16).args,
            launch(kv_cache_gb=0.5, paged_kv=True, prefix_cache=True, speculative=SpeculativeConfig("ngram")).args,
            tp2.args, launch(fused_kernels=True).args]
    code = ("import json, sys\nfrom vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
            "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "p = make_arg_parser(FlexibleArgumentParser())\n"
            "for a in json.loads(sys.argv[1]):\n    ns = p.parse_args(['--model', *a])\n"
            "    cc = ns.compilation_config\n"
            "    print(ns.block_size, ns.enable_prefix_caching, ns.dtype, ns.tensor_parallel_size, ns.load_format,\n"
            "          (ns.speculative_config or {}).get('method'), cc.mode, cc.cudagraph_mode)\n")
    out = subprocess.run([str(VLLM_PY), "-c", code, json.dumps(sets)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # fused_kernels off: compilation mode NONE (0, eager), parsed into vLLM's own CompilationConfig
    assert out.stdout.split("\n")[:5] == ["128 False float32 1 auto None 0 None",
                                           "16 False bfloat16 1 auto None 0 FULL_DECODE_ONLY",
                                           "128 True float32 1 auto ngram 0 None", "16 False bfloat16 2 dummy None 0 NONE",
                                           "128 False float32 1 auto None None None"]  # on: vLLM's own default


# --- the launcher: a fake `vllm serve` run by engine.server.python ---
FAKE_SERVER = textwrap.dedent('''
    import http.server, os, signal, subprocess, sys
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    child = subprocess.Popen(["sleep", "600"])  # like vLLM's engine core: a process of the server's own
    print("CHILD", child.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"vllm:kv_cache_usage_perc{engine=\\"0\\"} 0.25\\n" if self.path == "/metrics" else b"ok"
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable that stands in for vLLM's interpreter: it gets `vllm_cli.py serve DIR --port N ...`."""
    script = tmp_path / "fake_server.py"
    script.write_text(body)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nshift\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def model_dir(tmp_path: Path) -> ModelConfig:
    d = tmp_path / "model"
    d.mkdir()
    # head_dim 32: one that vLLM's CPU attention takes (optladder/backends/vllm_env.py)
    (d / "config.json").write_text(json.dumps({"vocab_size": 100, "hidden_size": 128, "intermediate_size": 128,
                                               "num_hidden_layers": 2, "num_attention_heads": 4, "rms_norm_eps": 1e-5,
                                               "max_position_embeddings": 4096, "num_key_value_heads": 2}))
    return ModelConfig(name="fake", source="hf_dir", path=str(d), tokenizer="smollm2")


def vllm_cfg(python: str, port: int = 0, timeout: float = 60.0) -> EngineConfig:
    return EngineConfig(name="vllm", block_size=128, device="cpu", max_model_len=1024,
                        server=ServerConfig(python=python, port=port, startup_timeout_s=timeout))


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path):
    from optladder.backends.vllm_server import VLLMServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        marker = tmp_path / "started"
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is already in use"):
            VLLMServer(model_dir(tmp_path), vllm_cfg(fake_python(tmp_path, f"open({str(marker)!r}, 'w')"), port))
        assert not marker.exists()  # refused before the command ran
    assert not port_in_use("127.0.0.1", port)


def test_a_failed_start_reports_exit_code_and_log_tail(tmp_path):
    from optladder.backends.vllm_server import VLLMServer

    py = fake_python(tmp_path, "import sys\nprint('loading weights')\nprint('RuntimeError: no device found')\n"
                               "sys.exit(3)\n")
    with pytest.raises(ServerStartError, match=r"(?s)exited with status 3.*loading weights.*no device found"):
        VLLMServer(model_dir(tmp_path), vllm_cfg(py))


def test_a_server_that_never_gets_healthy_is_stopped_at_the_deadline(tmp_path):
    proc_file = tmp_path / "pid"
    py = fake_python(tmp_path, f"import os, time\nopen({str(proc_file)!r}, 'w').write(str(os.getpid()))\n"
                               "print('compiling', flush=True)\ntime.sleep(600)\n")
    from optladder.backends.vllm_server import VLLMServer

    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match=r"(?s)not healthy .* within 2 s.*compiling"):
        VLLMServer(model_dir(tmp_path), vllm_cfg(py, timeout=2.0))
    assert time.monotonic() - t0 < 30
    assert not _alive(int(proc_file.read_text()))


def test_metrics_are_read_from_the_servers_prometheus_endpoint(tmp_path):
    from optladder.backends.vllm_server import VLLMServer

    with VLLMServer(model_dir(tmp_path), vllm_cfg(fake_python(tmp_path, FAKE_SERVER))) as server:
        with server.measure(interval_s=0.05) as probe:
            time.sleep(0.3)
        pid = server.process.proc.pid
    assert probe.metrics["perf/kv_util"] == pytest.approx(0.25)
    assert probe.metrics["perf/peak_mem_gb"] > 0
    assert not _alive(pid)


RUNNER = textwrap.dedent('''
    import sys, time
    sys.path.insert(0, {root!r})
    from optladder.backends.vllm_server import VLLMServer
    from tests.test_adapters import model_dir, vllm_cfg
    from pathlib import Path
    server = VLLMServer(model_dir(Path({tmp!r})), vllm_cfg({python!r}))
    print("SERVER", server.process.proc.pid, flush=True)
    time.sleep(600)  # "the replay": interrupted by the test
''')


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_server_process_survives_an_interrupted_run(tmp_path, sig):
    (tmp_path / "run").mkdir()
    py = fake_python(tmp_path / "run", FAKE_SERVER)
    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(root=str(ROOT), tmp=str(tmp_path), python=py))
    runner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = runner.stdout.readline()
        assert line.startswith("SERVER"), line
        server = int(line.split()[1])
        children = [c.pid for c in psutil.Process(server).children(recursive=True)]
        assert children, "the fake server should have a child of its own"
        runner.send_signal(sig)
        runner.wait(timeout=60)
        assert _wait_gone([server, *children]) == []
    finally:
        if runner.poll() is None:
            runner.kill()


# --- the HF adapter against the reference engine ---
@pytest.mark.slow
def test_hf_greedy_text_equals_the_reference_engine_in_float32():
    from optladder.backends.hf import HFEngine
    from optladder.engine.llm_engine import LLMEngine
    from optladder.engine.sequence import SamplingParams
    from optladder.engine.tokenizer import chat_token_ids

    mc = ModelConfig()
    base = dict(dtype="float32", device="cpu", max_model_len=512, kv_cache_gb=0.2)
    ref = LLMEngine(mc, EngineConfig(**base))
    questions = ["What is the capital of France?", "Name three colors.", "Write one sentence about rain."]
    prompts = [chat_token_ids(ref.tokenizer, q) for q in questions]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=False)  # to EOS, as quality runs are
    want = [s.output_text for s in ref.generate(prompts, greedy)]
    for kw in ({}, {"dynamic_batching": True, "flash_attn": True}):  # generate, then continuous batching
        hf = HFEngine(mc, EngineConfig(name="hf", **base, **kw))
        try:
            assert hf.generate(prompts, 12) == want, kw
        finally:
            hf.close()


@pytest.mark.parametrize("kw", [{}, {"dynamic_batching": True}])
def test_hf_replay_gives_per_token_records(kw):
    from optladder.backends.hf import HFEngine
    from optladder.engine.sequence import SamplingParams
    from optladder.traffic.replay import InProcessDriver
    from optladder.traffic.replay_config import Pacing, ReplayConfig
    from optladder.traffic.request import Request

    eng = HFEngine(ModelConfig(name="tiny", source="random", tokenizer="smollm2", vocab_size=49152, hidden_size=64,
                               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16),
                   EngineConfig(name="hf", max_model_len=256, batch_size=3, batch_timeout_ms=20, **kw))
    reqs = [Request(f"r{i}", list(range(100 + i, 120 + 3 * i)), 5 + i, scheduled_at=0.05 * i) for i in range(5)]
    reqs.append(Request("too-long", [7] * 300, 4, scheduled_at=0.1))
    params = lambda r: SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)  # noqa: E731
    try:
        recs = InProcessDriver(eng, params).replay(reqs, ReplayConfig(progress=False), Pacing("open"))
    finally:
        eng.close()
    for req, rec in zip(reqs[:-1], recs):
        assert rec.ok and rec.output_tokens == req.output_len == len(rec.token_times), rec
        assert 0 < rec.ttft < rec.e2e and rec.token_times == sorted(rec.token_times)
    assert not recs[-1].ok and "max_model_len" in recs[-1].error


# --- vLLM end to end ---
class _GroupWatch(threading.Thread):
    """Notes the process group of the vLLM server on `port` while a run goes on (other runs use other
    ports), so afterwards every process of that group can be looked for, renamed ones (VLLM::Worker) too."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.pgids, self.done = port, set(), threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            for p in psutil.process_iter(["cmdline"]):
                cmd = " ".join(p.info["cmdline"] or [])
                if "vllm_cli.py" in cmd and f"--port {self.port} " in cmd:
                    with contextlib.suppress(ProcessLookupError):
                        self.pgids.add(os.getpgid(p.pid))

    def survivors(self) -> list[int]:
        out = []
        for p in psutil.process_iter():
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(p.pid) in self.pgids and _alive(p.pid):
                    out.append(p.pid)
        return out


@pytest.mark.slow
@needs_vllm
@pytest.mark.timeout(1800)
def test_vllm_end_to_end_with_smollm2(tmp_path, tracking_uri):
    from conftest import compose_config

    from optladder.experiments.experiment import run_experiment

    from optladder.backends.launcher import free_port

    port = free_port("127.0.0.1")
    cfg = compose_config(["engine=vllm", "model=smollm2_135m", "workload.num_requests=4", "quality.num_prompts=3",
                          "engine.kv_cache_gb=1", f"engine.server.port={port}", f"tracking.uri={tracking_uri}",
                          "tracking.enabled=false"])
    watch = _GroupWatch(port)
    watch.start()
    try:
        res = run_experiment(cfg, tmp_path / "run")
    finally:
        watch.done.set()
        watch.join()
    m = res.metrics
    assert m["perf/requests_ok"] == 4 and m["perf/requests_failed"] == 0
    for k in ("perf/ttft_ms_p50", "perf/tpot_ms_p50", "perf/e2e_ms_p99", "perf/server_ttft_ms_mean", "perf/preemptions",
              "perf/kv_util", "perf/kv_reserved_gb", "quality/bleu_vs_ref", "quality/rougeL_vs_ref"):
        assert k in m, (k, sorted(m))
    assert 0 < m["perf/kv_util"] <= 1 and m["perf/preemptions"] == 0
    assert all(o.strip() for o in res.outputs)
    # the near-tie check's input: vLLM's own top-k log-probs of every answer token, as token ids
    assert res.traces_unavailable is None and len(res.traces) == 3
    for tr in res.traces:
        assert tr.tokens and all(isinstance(t, int) for t in tr.tokens) and len(tr.top) == len(tr.tokens)
        for tok, row in zip(tr.tokens, tr.top):  # greedy: the chosen token is the most likely one
            assert row[0][0] == tok or row[0][1] - dict(row).get(tok, -1e9) < 1e-3
    assert res.opts_effective["paged_kv"]["state"] == ALWAYS_ON
    assert res.opts_effective["paged_kv"]["args"] == ["--block-size", "128"]
    assert watch.pgids and watch.survivors() == []  # no process of the run's server group is left
    assert os.path.exists(tmp_path / "run" / "summary.json")
