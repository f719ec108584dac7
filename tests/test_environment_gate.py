"""Arms measured on different machines, software or code: the latency gates stop deciding (gate.environment_check)."""
from __future__ import annotations

import pytest

from optladder.abtest.environment import across_runs, differences
from optladder.abtest.gates import GateConfig
from optladder.abtest.verdict import decide, verdict_table
from optladder.experiments.snapshot import environment
from tests.test_gates import E2E, QUIET, SCORES, arm, by_name

H200_A = {"host": "vm", "boot_id": "43c65434", "gpu_uuid": "GPU-1a2b", "cpu_model": "Intel(R) Xeon(R) Platinum 8468", "cpu_count": 16, "gpu": "NVIDIA H200",
          "gpu_count": 1, "driver": "580.159.04", "python": "3.12.3", "platform": "Linux-6.18",
          "torch_cuda": "13.0", "git_commit": "6c47b58", "git_dirty": False,
          "packages": {"torch": "2.11.0", "mlflow-skinny": "3.17.2"}, "cpu_threads": 16,
          "cuda_visible_devices": None}


def test_differences_name_each_field_and_skip_what_one_side_did_not_record():
    assert differences(H200_A, dict(H200_A)) == []
    other = {**H200_A, "host": "gpu-b", "git_commit": "1165f42", "packages": {"torch": "2.11.0", "mlflow-skinny": "3.18.0"},
             "cpu_threads": 8, "cuda_visible_devices": "1"}  # a setting and a granted device: not compared
    assert differences(H200_A, other) == ["git_commit: 6c47b58 != 1165f42", "host: vm != gpu-b",
                                          "packages.mlflow-skinny: 3.17.2 != 3.18.0"]
    older = {k: v for k, v in H200_A.items() if k not in ("cpu_model", "cpu_count")}  # before they were recorded
    assert differences(older, {**H200_A, "cpu_count": 64}) == []
    # two rented VMs of one kind: the same name and CPU name, told apart by their boot and their GPU
    assert differences(H200_A, {**H200_A, "boot_id": "9f00e1d2", "gpu_uuid": "GPU-3c4d"}) == \
        ["boot_id: 43c65434 != 9f00e1d2", "gpu_uuid: GPU-1a2b != GPU-3c4d"]
    # every run of both arms against the control's first; each difference once
    assert across_runs([H200_A, H200_A], [H200_A, {**H200_A, "host": "gpu-b"}, {**H200_A, "host": "gpu-b"}]) == \
        ["host: vm != gpu-b"]
    assert across_runs([], []) == [] and across_runs([H200_A], []) == []


def test_the_snapshot_records_which_machine_ran():
    env = environment()
    assert env["host"] and env["cpu_count"] and env["cpu_count"] >= 1
    assert env["boot_id"] and env["boot_id"] == environment()["boot_id"]  # Linux: this boot's, the same all along
    assert isinstance(env["cpu_model"], (str, type(None)))


def test_same_environment_changes_nothing():
    plain = decide(arm("control"), arm("candidate"), GateConfig(run_noise=QUIET), False)
    c, k = arm("control"), arm("candidate")
    c.environments, k.environments = [H200_A], [dict(H200_A)]
    v = decide(c, k, GateConfig(run_noise=QUIET), False)
    assert v.status == plain.status == "pass"
    assert [g.name for g in v.gates] == [g.name for g in plain.gates]


def other_machine(c, k) -> None:
    c.environments, k.environments = [H200_A], [{**H200_A, "host": "gpu-b", "git_commit": "1165f42"}]


def test_a_latency_pass_measured_on_another_machine_is_not_a_pass():
    c, k = arm("control"), arm("candidate")
    other_machine(c, k)
    v = decide(c, k, GateConfig(run_noise=QUIET), False)
    g = by_name(v)
    assert "host: vm != gpu-b" in g["environment:"].reason
    assert (v.status, v.exit_code) == ("inconclusive", 2)
    lat = g["latency_max_regression:perf/e2e_ms_p99"]
    assert lat.status == "pass" and not lat.decides and "different machines or code" in lat.reason
    env = g["environment:"]
    assert env.status == "inconclusive" and env.decides
    assert "git_commit: 6c47b58 != 1165f42" in env.reason
    assert "gate.environment_check=report" in env.reason
    assert "environment:" in verdict_table(v)


def test_a_latency_failure_across_machines_is_undecided_but_a_quality_failure_still_fails():
    c, k = arm("control"), arm("candidate", e2e=E2E * 1.5)
    assert decide(c, k, GateConfig(run_noise=QUIET), False).status == "fail"  # on one machine: 50% slower fails
    other_machine(c, k)
    v = decide(c, k, GateConfig(run_noise=QUIET), False)
    assert v.status == "inconclusive" and not by_name(v)["latency_max_regression:perf/e2e_ms_p99"].decides
    c, k = arm("control"), arm("candidate", scores=SCORES * 0.8)
    other_machine(c, k)
    assert decide(c, k, GateConfig(run_noise=QUIET), False).status == "fail"


def test_report_decides_anyway_and_ignore_does_not_look():
    c, k = arm("control"), arm("candidate")
    other_machine(c, k)
    v = decide(c, k, GateConfig(run_noise=QUIET, environment_check="report"), False)
    env = by_name(v)["environment:"]
    assert v.status == "pass" and not env.decides and "decided anyway" in env.reason
    assert by_name(v)["latency_max_regression:perf/e2e_ms_p99"].decides
    v = decide(c, k, GateConfig(run_noise=QUIET, environment_check="ignore"), False)
    assert v.status == "pass" and "environment:" not in by_name(v)


def test_a_bad_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"gate.environment_check='same' is not one of latency, report, ignore"):
        GateConfig(environment_check="same")
    with pytest.raises(ValueError, match="is not one of latency, report, ignore"):
        GateConfig.from_dict({"environment_check": False})  # what YAML makes of an unquoted `off`
    with pytest.raises(ValueError, match="environment_check"):
        GateConfig.from_dict({"environment_check": 3})


def test_runs_of_one_process_never_differ_and_unreadable_values_are_no_difference():
    a = {**H200_A, "process": "p1"}
    # what one process read of itself mid-run: a git status during an edit, nvidia-smi timing out
    assert differences(a, {**a, "git_dirty": True, "driver": None, "git_commit": None}) == []
    b = {**H200_A, "process": "p2"}
    assert differences(a, {**b, "driver": None, "git_commit": None}) == []  # None: could not be read
    assert differences(a, {**b, "git_dirty": True}) == ["git_dirty: False != True"]


def test_code_id_decides_over_the_commit_and_a_machine_identity_on_one_side_only_differs():
    docs_only = {**H200_A, "git_commit": "1165f42", "code_id": "c0de"}  # a commit that changed documents only
    assert differences({**H200_A, "code_id": "c0de"}, docs_only) == []
    assert differences({**H200_A, "code_id": "c0de"}, {**docs_only, "code_id": "beef"}) == ["code_id: c0de != beef"]
    assert differences(H200_A, docs_only) == ["git_commit: 6c47b58 != 1165f42"]  # one side without: the commit
    older = {k: v for k, v in H200_A.items() if k not in ("boot_id", "gpu_uuid")}  # from before they were kept
    assert differences(older, H200_A) == ["boot_id: not recorded != 43c65434", "gpu_uuid: not recorded != GPU-1a2b"]
    cpu = {k: v for k, v in H200_A.items() if k != "gpu_uuid"}
    assert differences(cpu, dict(cpu)) == []  # neither has one: nothing to compare


def test_no_latency_gate_means_nothing_for_the_machines_to_undecide():
    c, k = arm("control"), arm("candidate")
    other_machine(c, k)
    v = decide(c, k, GateConfig(run_noise=QUIET, latency_max_regression={}), False)
    assert v.status == "pass" and not by_name(v)["environment:"].decides
    empty = GateConfig(quality_margins_rel={}, min_exact_match_lossless=0.0, control_agreement_min={},
                       latency_max_regression={}, kl_max_mean=None, kl_max_p99=None, top1_agree_min=None,
                       ppl_max_rel_increase=None, environment_check="report")
    v = decide(c, k, empty, False)  # nothing configured stays inconclusive, whatever the environment gate says
    assert v.status == "inconclusive" and "config:" in by_name(v)
