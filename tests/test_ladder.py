"""The ladder: its rung logic with a stub arm runner and the real gates, then a real tiny run through run.py."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from optladder.abtest.gates import GateConfig
from optladder.abtest.ladder import keeps, ladder_table, rung_opts
from optladder.engine.opts import OPTS
from optladder.experiments.ab_run import Arm, gate_pair
from optladder.experiments.experiment import ExperimentResult
from optladder.experiments.ladder_run import climb
from optladder.experiments.resume import load_result, resume_rung, why_not
from optladder.traffic.request import RequestRecord

ROOT = Path(__file__).resolve().parents[1]
N = 40  # requests and prompts per stub run: enough pairs for the bootstrap gates to decide


def stub_result(opts: list[str], effects: dict[str, str]) -> ExperimentResult:
    """What an arm with `opts` on would measure: the baseline's outputs and latencies, changed by the opts'
    effects ('rewrites': different text on a quarter of the prompts; 'slower': E2E x1.5; 'faster': x0.8;
    'unscored': BLEU against the references not measured, which no gate may pass)."""
    rng = np.random.default_rng(0)
    e2e = rng.uniform(1.0, 2.0, N)
    outputs = [f"the answer to question number {i} is a sentence long enough to score" for i in range(N)]
    for opt in opts:
        effect = effects.get(opt, "faster")
        e2e = e2e * {"slower": 1.5, "faster": 0.8}.get(effect, 1.0)
        if effect == "rewrites":
            outputs = [o + " reworded" if i % 4 == 0 else o for i, o in enumerate(outputs)]
    records = [RequestRecord(f"r{i}", 0.0, 10, 4, sent_at=0.0, first_token_at=t / 4, finished_at=t, output_tokens=4,
                             ok=True) for i, t in enumerate(e2e)]
    per_prompt = {m: [0.5] * N for m in ("quality/bleu_vs_ref", "quality/rouge1_vs_ref", "quality/rouge2_vs_ref",
                                         "quality/rougeL_vs_ref")}
    if any(effects.get(o) == "unscored" for o in opts):
        del per_prompt["quality/bleu_vs_ref"]
    metrics = {"perf/e2e_ms_p99": float(np.percentile(e2e, 99) * 1000), "perf/ttft_ms_p50": 100.0,
               **{m: 0.5 for m in per_prompt}}
    return ExperimentResult(f"run-{'+'.join(opts) or 'base'}", Path("."), metrics, records, outputs, per_prompt,
                            "same-requests", "same-prompts", {}, opts)


def stub_climb(rungs: list[str], effects: dict[str, str], keep_inconclusive: bool = True):
    ran: list[tuple[str, list[str]]] = []
    judged: list[tuple[str, str]] = []

    def run_rung(name: str, opts: list[str], prev=None) -> Arm:
        ran.append((name, opts))
        cfg = OmegaConf.create({"engine": {o: o in opts for o in OPTS}})
        return Arm(name, [], cfg, [stub_result(opts, effects)])

    def judge(prev: Arm, cand: Arm):
        judged.append((prev.name, cand.name))
        # one run per rung: the latency gate decides with the run-to-run noise an A/A sweep would have measured
        return gate_pair(prev, cand, GateConfig(n_boot=300, run_noise={"perf/e2e_ms_p99": 0.02}))[:2]

    rows, accepted = climb(rungs, keep_inconclusive, run_rung, judge)
    return rows, accepted, ran, judged


def test_a_failing_rung_is_left_out_and_later_rungs_are_judged_against_the_last_kept_one():
    rows, accepted, ran, judged = stub_climb(["paged_kv", "flash_attn", "dynamic_batching", "batched_decode"],
                                             {"flash_attn": "rewrites", "dynamic_batching": "slower"})
    assert [r["status"] for r in rows] == ["baseline", "pass", "fail", "fail", "pass"]
    assert ran == [("rung0-baseline", []), ("rung1-paged_kv", ["paged_kv"]),
                   ("rung2-flash_attn", ["paged_kv", "flash_attn"]),
                   ("rung3-dynamic_batching", ["paged_kv", "dynamic_batching"]),  # flash_attn left out
                   ("rung4-batched_decode", ["paged_kv", "batched_decode"])]
    assert judged == [("rung0-baseline", "rung1-paged_kv"), ("rung1-paged_kv", "rung2-flash_attn"),
                      ("rung1-paged_kv", "rung3-dynamic_batching"), ("rung1-paged_kv", "rung4-batched_decode")]
    assert [r["accepted_rung"] for r in rows] == [0, 1, 1, 1, 4]
    assert accepted == ["paged_kv", "batched_decode"]
    why = {g["gate"] for g in rows[2]["verdict"]["gates"] if g["status"] == "fail"}
    assert "exact_match" in why  # the rewriting opt fails on the control's exact outputs
    assert {g["gate"] for g in rows[3]["verdict"]["gates"] if g["status"] == "fail"} == {"latency_max_regression"}


def test_an_undecided_rung_is_kept_only_when_the_ladder_says_so():
    for keep, want in ((True, ["flash_attn", "batched_decode"]), (False, ["batched_decode"])):
        rows, accepted, ran, _ = stub_climb(["flash_attn", "batched_decode"], {"flash_attn": "unscored"}, keep)
        assert rows[1]["status"] == "inconclusive" and rows[1]["kept"] is keep
        assert ran[2][1] == want and accepted == want


def tiny_ladder_args(out: Path, uri: str, rungs: str) -> list[str]:
    return ["+ladder=seed", f"ladder.rungs={rungs}", "model=tiny", "workload.num_requests=6", "workload.rate=20",
            "workload.input_len_range=[8,32]", "workload.output_len_range=[2,8]", "quality.num_prompts=2",
            "quality.max_new_tokens=8", "replay.progress=false", "engine.kv_cache_gb=0.05", "engine.max_model_len=1024",
            "tracking.system_metrics=false", f"tracking.uri={uri}", f"hydra.run.dir={out}"]


def run_py(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPTLADDER_CACHE": os.environ.get("OPTLADDER_CACHE", str(ROOT / ".cache"))}
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def tiny_ladder(tmp_path_factory):
    """The real thing, small: the baseline and one rung, real runs gated, with its files and MLflow runs."""
    tmp = tmp_path_factory.mktemp("ladder")
    uri, out = f"sqlite:///{tmp / 'mlflow.db'}", tmp / "ladder"
    p = run_py(tiny_ladder_args(out, uri, "[batched_decode]"))
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp, uri, out


@pytest.mark.e2e
def test_ladder_through_run_py_on_the_tiny_model(tiny_ladder):
    _, uri, out = tiny_ladder
    ladder = json.loads((out / "ladder.json").read_text())
    rows = ladder["rungs"]
    assert [(r["rung"], r["opt"], r["opts"]) for r in rows] == [(0, None, []),
                                                               (1, "batched_decode", ["batched_decode"])]
    assert ladder["accepted"] == (["batched_decode"] if rows[1]["kept"] else [])  # 6 requests: may be undecided
    exact = [g for g in rows[1]["verdict"]["gates"] if g["gate"] == "exact_match"]
    assert exact and exact[0]["status"] == "pass"  # a lossless rung: the baseline's exact greedy text
    assert (out / "ladder.md").read_text().startswith("| metric | baseline |")
    assert rows[1]["environment_vs_baseline"] == []  # one process: one environment, nothing to say
    assert "another environment" not in (out / "ladder.md").read_text()
    assert (out / "ladder.png").stat().st_size > 0
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("optladder").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].data.tags["optladder.kind"] == "ladder"
    assert {c.info.run_id for c in children} == {r["run_id"] for r in rows}
    assert {a.path for a in client.list_artifacts(parents[0].info.run_id)} >= {"ladder.json", "ladder.md",
                                                                              "ladder.png"}


def resume_elsewhere(tmp: Path, uri: str, first: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """Resume `first` with rung 1 cut off mid-rung and the baseline recorded as run on another machine."""
    (first / "rung1-batched_decode-r0" / "summary.json").rename(tmp / "summary.json")  # as if cut off mid-rung
    snap = first / "rung0-baseline-r0" / "config_snapshot.json"
    kept = snap.read_text()
    earlier = json.loads(kept)
    earlier["environment"]["host"] = "another-machine"  # as if the baseline ran in an earlier session elsewhere
    snap.write_text(json.dumps(earlier))
    try:
        return run_py([*tiny_ladder_args(out, uri, "[batched_decode,paged_kv]"), f"ladder.resume_from={first}", *extra])
    finally:
        (tmp / "summary.json").rename(first / "rung1-batched_decode-r0" / "summary.json")
        snap.write_text(kept)


def gates_of(row: dict) -> dict:
    return {g["gate"]: g for g in row["verdict"]["gates"]}


@pytest.mark.e2e
def test_a_resumed_ladder_reads_back_the_rungs_that_finished_and_runs_the_rest(tiny_ladder):
    tmp, uri, first = tiny_ladder
    before = json.loads((first / "ladder.json").read_text())["rungs"]
    out = tmp / "resumed"
    p = resume_elsewhere(tmp, uri, first, out)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((out / "ladder.json").read_text())["rungs"]
    assert [r["opt"] for r in rows] == [None, "batched_decode", "paged_kv"]
    assert rows[0]["run_id"] == before[0]["run_id"]  # read back, not run: the earlier run's id
    assert rows[0]["metrics"] == before[0]["metrics"]
    assert rows[1]["run_id"] != before[1]["run_id"] and rows[2]["run_id"] not in {r["run_id"] for r in before}
    assert (out / "rung0-baseline-r0" / "requests.jsonl").is_file()  # the new ladder's directory is whole
    said = p.stdout + p.stderr
    assert "resume: rung0-baseline taken from" in said and "rung1-batched_decode runs again" in said
    # rung 1 runs here, its control was read back from another machine: the control runs again here, before rung 1
    # (ladder.rerun_control=differs), and rung 1 is judged against that run, with nothing to say about machines
    assert "rung0-baseline was read back from another run (the arms ran in different environments (" in said
    assert "host: another-machine != " in said
    rerun = "rung0-baseline-here-rung1-batched_decode"
    assert said.index("running it again here as rung1-batched_decode's control") < said.index("rung 1 (+batched_decode)")
    assert (out / f"{rerun}-r0" / "requests.jsonl").is_file()
    assert rows[1]["verdict"]["control"] == rerun
    assert rows[2]["verdict"]["control"] == "rung1-batched_decode"  # ran here: judged as it is
    for row in rows[1:]:
        assert "environment" not in gates_of(row) and gates_of(row)["latency_max_regression"]["decides"]
    # the headline compares every rung with a baseline measured elsewhere: ladder.md says so, rung by rung
    assert all(r["environment_vs_baseline"] for r in rows[1:])
    md = (out / "ladder.md").read_text()
    assert "Rungs measured in another environment than the baseline" in md
    assert "- rung 1 (+batched_decode): " in md and "host: another-machine != " in md
    mlflow.set_tracking_uri(uri)
    names = {r.info.run_name for r in MlflowClient().search_runs(
        [MlflowClient().get_experiment_by_name("optladder").experiment_id])}
    assert f"{rerun} (repeat 0)" in names
    # a later resume from that directory reads the rerun back with the rest and judges rung 1 against it again:
    # nothing runs, and the verdict is the same kind (no environment gate)
    again = tmp / "resumed-again"
    p2 = run_py([*tiny_ladder_args(again, uri, "[batched_decode,paged_kv]"), f"ladder.resume_from={out}"])
    assert p2.returncode == 0, p2.stderr[-3000:]
    rows2 = json.loads((again / "ladder.json").read_text())["rungs"]
    assert [r["run_id"] for r in rows2] == [r["run_id"] for r in rows]  # every rung read back
    assert rows2[1]["verdict"]["control"] == rerun and "environment" not in gates_of(rows2[1])
    assert "running it again here" not in p2.stdout + p2.stderr
    assert (again / f"{rerun}-r0" / "summary.json").is_file()  # copied: the older directory can go


@pytest.mark.e2e
def test_a_control_from_another_machine_not_run_again_keeps_latency_from_deciding(tiny_ladder):
    tmp, uri, first = tiny_ladder
    out = tmp / "resumed-never"
    p = resume_elsewhere(tmp, uri, first, out, "ladder.rerun_control=never")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((out / "ladder.json").read_text())["rungs"]
    assert not list(out.glob("rung0-baseline-here-*"))
    # rung 1 ran here, its control elsewhere: its latency gates do not decide, and the verdict says why;
    # rung 2 ran here too, against rung 1: nothing to say
    g1, g2 = gates_of(rows[1]), gates_of(rows[2])
    assert g1["environment"]["status"] == "inconclusive" and g1["environment"]["decides"]
    assert "host: another-machine != " in g1["environment"]["reason"]
    assert not g1["latency_max_regression"]["decides"] and rows[1]["verdict"]["status"] != "pass"
    assert "environment" not in g2 and g2["latency_max_regression"]["decides"]


@pytest.mark.e2e
def test_an_earlier_rung_of_other_settings_or_data_is_not_taken(tiny_ladder, tmp_path):
    _, _, first = tiny_ladder
    res = load_result(first / "rung0-baseline-r0")
    resolved = res.snapshot["resolved_config"]
    digests = (res.requests_digest, res.prompts_digest)
    assert why_not(res, resolved, digests) is None
    other = {**resolved, "engine": {**resolved["engine"], "max_num_seqs": 3}}
    assert why_not(res, other, digests) == "its settings differ in ['engine']"
    assert why_not(res, resolved, ("x", digests[1])) == "it replayed or scored different data"
    assert resume_rung(first, "rung0-baseline", 1, other, digests, tmp_path) is None
    assert resume_rung(first, "rung0-baseline", 2, resolved, digests, tmp_path) is None  # no repeat 1 there
    got = resume_rung(first, "rung0-baseline", 1, resolved, digests, tmp_path)
    assert got[0].records == res.records and got[0].outputs == res.outputs and got[0].run_dir.parent == tmp_path
    assert len(got[0].quality_per_prompt["quality/bleu_vs_ref"]) == len(res.outputs) == 2


def test_a_rung_that_raises_is_left_out_with_its_reason_and_the_ladder_goes_on():
    effects = {"flash_attn": "raises"}

    def raising_climb(stop: bool):
        def run_rung(name: str, opts: list[str], prev=None) -> Arm:
            if "flash_attn" in opts:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\n(details)")
            cfg = OmegaConf.create({"engine": {o: o in opts for o in OPTS}})
            return Arm(name, [], cfg, [stub_result(opts, effects)])

        noise = GateConfig(n_boot=300, run_noise={"perf/e2e_ms_p99": 0.02})
        return climb(["paged_kv", "flash_attn", "batched_decode"], True, run_rung,
                     lambda prev, cand: gate_pair(prev, cand, noise)[:2], stop)

    rows, accepted = raising_climb(False)
    assert [r["status"] for r in rows] == ["baseline", "pass", "error", "pass"]
    assert rows[2]["reason"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" and not rows[2]["kept"]
    assert rows[3]["opts"] == ["paged_kv", "batched_decode"] and accepted == ["paged_kv", "batched_decode"]
    assert "rung 2 (+flash_attn): RuntimeError: CUDA out of memory" in ladder_table(rows)
    with pytest.raises(RuntimeError, match="out of memory"):
        raising_climb(True)


def test_a_sigterm_a_library_turned_into_its_own_error_still_ends_the_ladder(monkeypatch):
    """A SIGTERM lands wherever the main thread is: inside Hydra's config composition its Terminated was lost and
    the rung recorded "ConfigCompositionException: 'NoneType' object has no attribute '_invalidate_flags_cache'",
    and the ladder went on past its deadline. The handler remembers the signal: the rung's error ends the ladder as
    the SIGTERM it was, and an error without a signal is still the rung's reason."""
    import signal

    from optladder.backends import launcher

    monkeypatch.setattr(launcher, "_SIGNALLED", [])
    effects: dict = {}

    def run_rung(name: str, opts: list[str], prev=None) -> Arm:
        if "flash_attn" in opts:
            try:
                launcher._on_sigterm(signal.SIGTERM, None)  # as the signal would, mid-composition
            except launcher.Terminated:
                raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'") from None
        cfg = OmegaConf.create({"engine": {o: o in opts for o in OPTS}})
        return Arm(name, [], cfg, [stub_result(opts, effects)])

    rows: list = []
    noise = GateConfig(n_boot=300, run_noise={"perf/e2e_ms_p99": 0.02})
    with pytest.raises(launcher.Terminated) as stopped:
        climb(["paged_kv", "flash_attn", "batched_decode"], True, run_rung,
              lambda prev, cand: gate_pair(prev, cand, noise)[:2], on_row=lambda r, a: rows.append(len(r)))
    assert stopped.value.signum == signal.SIGTERM and isinstance(stopped.value.__cause__, AttributeError)
    assert rows == [1, 2]  # the baseline and paged_kv were handed over; no error row for flash_attn
    monkeypatch.setattr(launcher, "_SIGNALLED", [])  # the same error without a signal: the rung's reason

    def raising(name: str, opts: list[str], prev=None) -> Arm:
        if "flash_attn" in opts:
            raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")
        return run_rung(name, opts, prev)
    plain, _ = climb(["paged_kv", "flash_attn"], True, raising, lambda prev, cand: gate_pair(prev, cand, noise)[:2])
    assert plain[2]["status"] == "error" and "_invalidate_flags_cache" in plain[2]["reason"]
    from optladder.experiments.lifecycle import exit_status
    assert exit_status(stopped.value) == 143


@pytest.mark.e2e
@pytest.mark.parametrize("lost_as", ["UserError", "RuntimeError"])
def test_run_py_ends_as_sigterm_when_a_library_lost_the_signal_s_exception(lost_as):
    """run.py's exit status for a SIGTERM whose exception became another error on its way up (a UserError: what
    Hydra's composition error becomes; anything else): 143, not 3 (a user error) nor 70 (a crash). The experiment
    itself (run_experiment) is replaced; Hydra, run.py's _main and its handling are the real ones."""
    code = ("import runpy, signal, sys\n"
            "from optladder.backends import launcher\n"
            "from optladder.experiments import experiment\n"
            "from optladder.experiments.errors import UserError\n"
            "def lost(*args, **kwargs):\n"
            "    try:\n"
            "        launcher._on_sigterm(signal.SIGTERM, None)\n"
            "    except launcher.Terminated:\n"
            f"        raise {lost_as}('ConfigCompositionException: lost') from None\n"
            "experiment.run_experiment = lost\n"
            "sys.argv = ['run.py', 'tracking.enabled=false']\n"
            "runpy.run_path('run.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, (done.stdout + done.stderr)[-2000:]
    assert "stopped by signal 15" in done.stdout + done.stderr


def test_a_lost_sigterm_ends_an_mlflow_run_killed_and_an_error_without_one_failed(monkeypatch):
    import signal

    from optladder.backends import launcher
    from optladder.experiments.tracking import run_status

    monkeypatch.setattr(launcher, "_SIGNALLED", [])
    assert run_status(RuntimeError("lost")) == "FAILED" and run_status(None) == "FINISHED"
    monkeypatch.setattr(launcher, "_SIGNALLED", [signal.SIGTERM])
    assert run_status(RuntimeError("lost")) == "KILLED" and run_status(None) == "FINISHED"
    # a call to the store that the signal interrupted ends the run, not the tracking
    from optladder.experiments import tracking

    def interrupted() -> None:
        raise ConnectionError("lost mid-call")
    monkeypatch.setattr(tracking, "LOST", [])
    tracker = tracking.Tracker.__new__(tracking.Tracker)
    tracker.enabled = True
    with pytest.raises(launcher.Terminated):
        tracker._call("log_metrics", interrupted)
    monkeypatch.setattr(launcher, "_SIGNALLED", [])
    tracker._call("log_metrics", interrupted)  # without a signal: tracking off, the run goes on
    assert not tracker.enabled and tracking.LOST[0].startswith("log_metrics: ")


def test_ladder_table_compares_the_baseline_with_the_last_accepted_rung():
    base = {"perf/ttft_ms_p50": 1444.0, "perf/tpot_ms_p50": 61.54, "perf/e2e_ms_p99": 25459.0,
            "perf/throughput_out_tok_s": 41.29, "capacity/max_concurrency": 10000.0, "perf/peak_mem_gb": 2.146,
            "perf/kv_reserved_gb": 0.7031, "perf/kv_util": 0.0, "quality/bleu_vs_ref": 9.729,
            "quality/rougeL_vs_ref": 0.436}
    kept = {"perf/ttft_ms_p50": 1377.0, "perf/tpot_ms_p50": 58.55, "perf/e2e_ms_p99": 12345.6,
            "capacity/max_concurrency": 9999.0, "perf/peak_mem_gb": 2.207, "perf/kv_util": 0.9,
            "quality/exact_match_vs_control": 1.0, "quality/bleu_vs_control": 100.0, "quality/rougeL_vs_control": 1.0,
            "quality/bleu_vs_ref": 9.488, "quality/rougeL_vs_ref": 0.4231}
    failed = {"perf/ttft_ms_p50": 1000.0, "quality/exact_match_vs_control": 0.5}
    rungs = [{"rung": 0, "opt": None, "opts": [], "status": "baseline", "accepted_rung": 0, "metrics": base},
             {"rung": 1, "opt": "paged_kv", "opts": ["paged_kv"], "status": "pass", "accepted_rung": 1, "metrics": kept},
             {"rung": 2, "opt": "flash_attn", "opts": ["paged_kv", "flash_attn"], "status": "fail", "accepted_rung": 1,
              "metrics": failed}]
    assert ladder_table(rungs) == "\n".join([
        "| metric | baseline | all on (paged_kv) | change |",
        "|---|---|---|---|",
        "| TTFT p50 (ms) | 1444 | 1377 | -4.6% |",
        "| TPOT p50 (ms) | 61.54 | 58.55 | -4.9% |",
        "| E2E p99 (ms) | 25,459 | 12,346 | -51.5% |",
        "| throughput (out tok/s) | 41.29 | - | - |",
        "| capacity at P99 ≤ SLO (concurrency) | 10,000 | 9999 | -0.0% |",
        "| peak memory (GiB) | 2.146 | 2.207 | +2.8% |",
        "| KV reserved (GiB) | 0.7031 | - | - |",
        "| KV utilization | 0 | 0.9 | - |",  # no change relative to 0
        "| BLEU vs references | 9.729 | 9.488 | -2.5% |",
        "| ROUGE-L vs references | 0.436 | 0.4231 | -3.0% |",
        "| BLEU / ROUGE-L vs its control's answers (last accepted rung) | - | 100 / 1 | - |",
        "",
        "| rung | opt added | verdict | TTFT p50 | TPOT p50 | E2E p99 | peak mem GiB | exact match vs prev |",
        "|---|---|---|---|---|---|---|---|",
        "| 0 | baseline | baseline | 1444 | 61.54 | 25,459 | 2.146 | - |",
        "| 1 | paged_kv | pass | 1377 | 58.55 | 12,346 | 2.207 | 1 |",
        "| 2 | flash_attn | fail | 1000 | - | - | - | 0.5 |"])
    only_base = ladder_table(rungs[:1]).splitlines()
    assert only_base[0] == "| metric | baseline | all on (none) | change |" and only_base[2].endswith("| +0.0% |")
    two_kept = [*rungs[:2], {**rungs[2], "status": "pass", "accepted_rung": 2}]
    assert ladder_table(two_kept).splitlines()[0] == "| metric | baseline | all on (paged_kv+flash_attn) | change |"


def test_a_switchback_ladders_table_starts_from_the_baseline_replayed_in_blocks():
    """In a switchback ladder the rungs ran in blocks (each starting with no queue) and the baseline's own run as
    one whole trace: the headline compares the last accepted rung with the baseline beside rung 1, which ran in the
    same blocks. A ladder of whole runs keeps the baseline's own run."""
    whole = {"perf/ttft_ms_p50": 1364.0, "perf/e2e_ms_p99": 14787.0, "quality/bleu_vs_ref": 9.895}
    in_blocks = {"perf/ttft_ms_p50": 60.66, "perf/e2e_ms_p99": 10738.0}
    rung = {"perf/ttft_ms_p50": 38.44, "perf/e2e_ms_p99": 1475.0}
    rungs = [{"rung": 0, "opt": None, "opts": [], "status": "baseline", "accepted_rung": 0, "metrics": whole},
             {"rung": 1, "opt": "cuda_graphs", "opts": ["cuda_graphs"], "status": "pass", "accepted_rung": 1,
              "metrics": rung, "blocks": 15, "control_beside": {"name": "rung0-baseline-again-rung1-cuda_graphs",
                                                                "metrics": in_blocks}}]
    lines = ladder_table(rungs).splitlines()
    assert lines[0] == "| metric | baseline (beside rung 1, in blocks) | all on (cuda_graphs) | change |"
    assert lines[2] == "| TTFT p50 (ms) | 60.66 | 38.44 | -36.6% |"
    assert "| BLEU vs references | 9.895 | - | - |" in lines  # quality: the baseline's own (the run beside scores none)
    interleaved = [rungs[0], {k: v for k, v in rungs[1].items() if k != "blocks"}]  # design=runs, interleave
    assert ladder_table(interleaved).splitlines()[2] == "| TTFT p50 (ms) | 1364 | 38.44 | -97.2% |"


def test_rung_opts_and_what_keeps_a_rung():
    assert rung_opts(["paged_kv"], "flash_attn") == ["paged_kv", "flash_attn"]
    assert [keeps(s, True) for s in ("pass", "inconclusive", "fail")] == [True, True, False]
    assert [keeps(s, False) for s in ("pass", "inconclusive", "fail")] == [True, False, False]


def interleaved_args(out: Path, uri: str) -> list[str]:
    """12 requests: enough pairs (gate.min_pairs) for a latency interval."""
    args = tiny_ladder_args(out, uri, "[batched_decode,paged_kv]")
    return [a.replace("num_requests=6", "num_requests=12") for a in args] + ["ladder.interleave=true"]


@pytest.fixture(scope="module")
def interleaved_ladder(tmp_path_factory):
    """ladder.interleave=true, small: the baseline, two rungs, each beside a run of its control."""
    tmp = tmp_path_factory.mktemp("interleaved")
    uri, out = f"sqlite:///{tmp / 'mlflow.db'}", tmp / "ladder"
    p = run_py(interleaved_args(out, uri))
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp, uri, out, p.stdout + p.stderr


@pytest.mark.e2e
def test_an_interleaved_rung_is_gated_against_its_control_run_beside_it(interleaved_ladder):
    tmp, uri, out, said = interleaved_ladder
    rows = json.loads((out / "ladder.json").read_text())["rungs"]
    assert "control_beside" not in rows[0]
    for row, control in ((rows[1], "rung0-baseline"), (rows[2], "rung1-batched_decode")):
        beside = f"{control}-again-rung{row['rung']}-{row['opt']}"
        ran = load_result(out / f"{beside}-r0")
        assert ran is not None and ran.run_id == row["control_beside"]["run_ids"][0]
        assert row["verdict"]["control"] == beside  # its latency gates read the run beside it
        assert ran.outputs == [] and not (out / f"{beside}-r0" / "quality_outputs.jsonl").exists()  # no prompts
        # its quality gates read the control's own answers: a lossless rung gives them back exactly
        assert gates_of(row)["exact_match"]["status"] == "pass"
        assert row["metrics"]["quality/exact_match_vs_control"] == 1.0
        assert row["control_beside"]["metrics"]["perf/e2e_ms_p99"] == ran.metrics["perf/e2e_ms_p99"]
        own = load_result(out / f"{control}-r0")
        assert ran.metrics["perf/e2e_ms_p99"] != own.metrics["perf/e2e_ms_p99"]  # another replay, not a copy
    # the latency gate compares the run beside the rung with the rung's, not the control's own run
    gate = gates_of(rows[1])["latency_max_regression"]
    base_again = load_result(out / "rung0-baseline-again-rung1-batched_decode-r0").metrics["perf/e2e_ms_p99"]
    assert gate["control"] == pytest.approx(base_again) and gate["candidate"] == pytest.approx(
        rows[1]["metrics"]["perf/e2e_ms_p99"])
    md = (out / "ladder.md").read_text()
    assert "Each rung against its control run beside it" in md
    assert "| 2 | paged_kv | rung1-batched_decode-again-rung2-paged_kv | " in md
    assert "Run-to-run noise measured beside the rungs" in md and "(n=2, mean " in md  # two A/A pairs
    # each rung's latency gates pooled gate.run_noise (0.10 x 4) with the A/A pairs measured up to it: rung 1 with
    # the baseline's own run and its run beside rung 1, rung 2 with that and rung 1's pair
    d = []
    for row, control in ((rows[1], "rung0-baseline"), (rows[2], "rung1-batched_decode")):
        own = {r.id: r.e2e for r in load_result(out / f"{control}-r0").records if r.ok}
        again = {r.id: r.e2e for r in load_result(out / f"{control}-again-rung{row['rung']}-{row['opt']}-r0").records
                 if r.ok}
        ids = sorted(own.keys() & again.keys())
        d.append(math.log(np.quantile([again[i] for i in ids], 0.99) / np.quantile([own[i] for i in ids], 0.99)))
        used = row["run_noise_pooled"]["perf/e2e_ms_p99"]
        assert used["pairs"] == len(d) and used["prior"] == 0.10 and used["prior_weight"] == 4
        assert used["pooled"] == pytest.approx(math.sqrt((4 * 0.10 ** 2 + sum(x * x for x in d)) / (4 + len(d))))
        gate = gates_of(row)["latency_max_regression"]
        assert gate["interval"] is not None and f"gate.run_noise {used['pooled']:.1%} x {4 + len(d)}" in gate["reason"]
    assert "The latency gates pooled them with gate.run_noise (ladder.pool_noise)" in md
    mlflow.set_tracking_uri(uri)
    names = {r.info.run_name for r in MlflowClient().search_runs(
        [MlflowClient().get_experiment_by_name("optladder").experiment_id])}
    assert "rung0-baseline-again-rung1-batched_decode (repeat 0)" in names


@pytest.mark.e2e
def test_a_resumed_interleaved_ladder_takes_a_rung_only_with_its_control_run_beside_it(interleaved_ladder):
    tmp, uri, first, _ = interleaved_ladder
    before = json.loads((first / "ladder.json").read_text())["rungs"]
    cut = first / "rung1-batched_decode-again-rung2-paged_kv-r0" / "summary.json"
    cut.rename(tmp / "summary.json")  # rung 2 finished, the control beside it did not: rung 2 runs again, beside it
    try:
        out = tmp / "resumed"
        p = run_py([*interleaved_args(out, uri), f"ladder.resume_from={first}"])
    finally:
        (tmp / "summary.json").rename(cut)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((out / "ladder.json").read_text())["rungs"]
    assert [r["run_id"] for r in rows[:2]] == [r["run_id"] for r in before[:2]]  # read back with its run beside
    assert rows[1]["control_beside"]["run_ids"] == before[1]["control_beside"]["run_ids"]
    assert rows[1]["verdict"]["control"] == "rung0-baseline-again-rung1-batched_decode"
    assert rows[2]["run_id"] != before[2]["run_id"]
    assert rows[2]["control_beside"]["run_ids"] != before[2]["control_beside"]["run_ids"]
    assert "rung2-paged_kv runs again: its control beside it" in p.stdout + p.stderr
    assert not list(out.glob("*-here-*"))  # the run beside a rung is its control here: nothing else runs again
    # the rung ran again into a directory of its own, not on top of the earlier run's records
    assert len(load_result(out / "rung2-paged_kv-r0").records) == 12
    assert not (out / "rung1-batched_decode-again-rung2-paged_kv-r0" / "quality_outputs.jsonl").exists()


@pytest.mark.e2e
def test_an_interleaved_rung_beside_a_control_from_another_machine_scores_the_control_s_answers_here(
        interleaved_ladder):
    """The control's own answers stand for the run beside a rung only where they were computed in the rung's
    environment: a control read back from another machine is run beside the rung with its quality prompts."""
    tmp, uri, first, _ = interleaved_ladder
    cut = first / "rung1-batched_decode-r0" / "summary.json"
    snap = first / "rung0-baseline-r0" / "config_snapshot.json"
    kept = snap.read_text()
    earlier = json.loads(kept)
    earlier["environment"]["host"] = "another-machine"
    answers = first / "rung0-baseline-r0" / "quality_outputs.jsonl"
    kept_answers = answers.read_text()
    other = [{**json.loads(line), "output": "answered elsewhere"} for line in kept_answers.splitlines() if line.strip()]
    cut.rename(tmp / "summary1.json")
    snap.write_text(json.dumps(earlier))
    answers.write_text("".join(json.dumps(r) + "\n" for r in other))  # that machine's answers were other ones
    try:
        out = tmp / "resumed-elsewhere"
        # rung 1 runs again here and must stay kept (rung 2 is read back against it): on a shared 2-core machine a
        # replay of 12 requests can come out 2x slower, so its latency gate here allows 11x (what is under
        # test is whose answers and which runs count, not the latency)
        p = run_py([*interleaved_args(out, uri), f"ladder.resume_from={first}",
                    "gate.latency_max_regression={perf/e2e_ms_p99:10.0}"])
    finally:
        (tmp / "summary1.json").rename(cut)
        snap.write_text(kept)
        answers.write_text(kept_answers)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((out / "ladder.json").read_text())["rungs"]
    beside = out / "rung0-baseline-again-rung1-batched_decode-r0"
    assert (beside / "quality_outputs.jsonl").is_file()  # scored here
    assert rows[1]["verdict"]["control"] == beside.name[:-len("-r0")] and "environment" not in gates_of(rows[1])
    assert rows[1]["metrics"]["quality/exact_match_vs_control"] == 1.0  # against the answers computed here
    # an A/A pair across two machines is not one (rung 1), nor one of a run made here and a run read back (rung 2,
    # read back with its run beside it, against rung 1 made here): no pair pooled
    assert "run_noise_pooled" not in rows[1] and "run_noise_pooled" not in rows[2]
    assert rows[2]["run_id"] == json.loads((first / "ladder.json").read_text())["rungs"][2]["run_id"]


def test_pooled_run_noise_counts_each_a_a_pair_as_one_degree_of_freedom_beside_the_prior():
    from optladder.abtest.verdict import aa_log_ratio, pooled_run_noise

    gate = GateConfig(run_noise={"perf/e2e_ms_p99": 0.10}, run_noise_weight=4)
    same, used = pooled_run_noise(gate, {})
    assert same is gate and used == {}
    pooled, used = pooled_run_noise(gate, {"perf/e2e_ms_p99": [0.3, -0.3], "perf/ttft_ms_p50": [1.0]})
    assert pooled.run_noise == {"perf/e2e_ms_p99": pytest.approx(math.sqrt((4 * 0.01 + 0.18) / 6))}
    assert pooled.run_noise_weight == 6 and gate.run_noise["perf/e2e_ms_p99"] == 0.10  # a copy
    assert used["perf/e2e_ms_p99"]["aa_rms"] == pytest.approx(0.3) and "perf/ttft_ms_p50" not in used  # no prior
    recs = [RequestRecord(f"r{i}", 0.0, 10, 4, sent_at=0.0, first_token_at=0.1, finished_at=1.0 + i, output_tokens=4,
                          ok=True) for i in range(5)]
    slower = [RequestRecord(r.id, 0.0, 10, 4, sent_at=0.0, first_token_at=0.1, finished_at=2 * r.finished_at,
                            output_tokens=4, ok=True) for r in recs]
    assert aa_log_ratio("perf/e2e_ms_p99", recs, slower) == pytest.approx(math.log(2))
    assert aa_log_ratio("perf/e2e_ms_p99", recs, slower[:1]) is None  # one request in both
    assert aa_log_ratio("perf/throughput_out_tok_s", recs, slower) is None  # not a paired latency


@pytest.mark.e2e
def test_without_tracking_every_a_a_pair_still_counts(tmp_path):
    """Runs without MLflow have no run id: the A/A pairs are told apart by their directories."""
    out = tmp_path / "ladder"
    args = [a for a in interleaved_args(out, "unused") if not a.startswith("tracking.")]
    # a bound no step noise reaches: rung 1 is kept, so rung 2's control is rung 1 and its pair a second one (a
    # rung 1 failed on a noisy machine leaves rung 2 against the baseline again, whose pair counts once)
    p = run_py([*args, "tracking=off", "++gate.latency_max_regression={perf/e2e_ms_p99:10.0}"])
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((out / "ladder.json").read_text())["rungs"]
    assert rows[1]["kept"], rows[1].get("verdict", {}).get("status")
    assert rows[1]["run_id"] is None
    assert [rows[i]["run_noise_pooled"]["perf/e2e_ms_p99"]["pairs"] for i in (1, 2)] == [1, 2]


@pytest.mark.e2e
def test_a_ladder_cut_short_keeps_the_rungs_it_reached(tmp_path):
    """ladder.json is written after every rung: a ladder ended by SIGTERM (a device call's deadline, a lost
    machine) leaves the verdicts so far, marked incomplete; an ended ladder's is marked complete."""
    import signal
    import time

    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "ladder"
    env = {**os.environ, "OPTLADDER_CACHE": os.environ.get("OPTLADDER_CACHE", str(ROOT / ".cache"))}
    log = tmp_path / "run.log"
    with open(log, "w") as sink:
        p = subprocess.Popen([sys.executable, "run.py", *interleaved_args(out, uri)], cwd=ROOT, env=env,
                             stdout=sink, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.time() + 600
            while not (out / "ladder.json").is_file() and p.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            assert p.poll() is None, "the ladder ended before its first rung's ladder.json was seen"
            p.send_signal(signal.SIGTERM)  # within rung 1: its control's run beside it or the rung itself
            p.wait(timeout=300)
        finally:
            p.kill()
    said = log.read_text()
    assert p.returncode == 143, said[-3000:]
    ladder = json.loads((out / "ladder.json").read_text())
    assert ladder["complete"] is False and ladder["planned"] == ["batched_decode", "paged_kv"]
    assert [r["opt"] for r in ladder["rungs"]] == [None]  # the baseline, judged as nothing, is what it reached
    assert ladder["rungs"][0]["run_id"] == load_result(out / "rung0-baseline-r0").run_id
    md = (out / "ladder.md").read_text()
    assert md.startswith("**Incomplete: 0 of 2 rungs done**") and "| baseline |" in md
    assert not (out / "ladder.png").exists()  # the chart is drawn once, at the end
    assert not list(out.glob(".ladder.*.tmp"))  # each file replaced whole


@pytest.mark.e2e
def test_an_ended_ladder_is_marked_complete(interleaved_ladder):
    _, _, out, _ = interleaved_ladder
    ladder = json.loads((out / "ladder.json").read_text())
    assert ladder["complete"] is True and ladder["planned"] == ["batched_decode", "paged_kv"]
    assert len(ladder["rungs"]) == 3 and not (out / "ladder.md").read_text().startswith("**Incomplete")


def test_climb_hands_over_every_row_as_it_is_made():
    """on_row sees the rows so far after each rung, the error row of a rung that raised too."""
    seen: list[tuple[list, list]] = []

    def run_rung(name, opts, prev=None):
        if "paged_kv" in opts:
            raise RuntimeError("CUDA out of memory (injected)")
        cfg = OmegaConf.create({"engine": {o: o in opts for o in OPTS}})
        return Arm(name, [], cfg, [stub_result(opts, {})])

    def judge(prev, cand):
        return gate_pair(prev, cand, GateConfig(n_boot=300, run_noise={"perf/e2e_ms_p99": 0.02}))[:2]

    rows, accepted = climb(["batched_decode", "paged_kv"], True, run_rung, judge,
                           on_row=lambda r, a: seen.append(([x["opt"] for x in r], list(a))))
    assert [s[0] for s in seen] == [[None], [None, "batched_decode"], [None, "batched_decode", "paged_kv"]]
    assert rows[2]["status"] == "error" and "out of memory" in rows[2]["reason"]
    assert seen[-1][1] == accepted
