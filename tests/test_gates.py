"""Gates, verdicts and rollout on synthetic arms with known answers."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest


from optladder.abtest.gates import METRICS, GateConfig, higher_is_better, validate_metric
from optladder.abtest.rollout import current, promote, rollback, rollout_plan
from optladder.abtest.verdict import ArmResult, decide
from optladder.quality.teacher_forced import TeacherForcedScores
from optladder.traffic.metrics import compute_metrics
from optladder.traffic.request import RequestRecord

QUALITY = ("quality/bleu_vs_ref", "quality/rouge1_vs_ref", "quality/rouge2_vs_ref", "quality/rougeL_vs_ref")
NO_TF = dict(kl_max_mean=None, kl_max_p99=None, top1_agree_min=None, ppl_max_rel_increase=None)
RNG = np.random.default_rng(0)
E2E = RNG.lognormal(0.0, 0.5, 200)  # seconds, per request
SCORES = RNG.uniform(20, 60, 200)  # per-prompt quality
# run-to-run noise as an A/A sweep on a quiet machine might measure it (a latency gate needs some)
QUIET = {f"perf/{m}": 0.01 for m in ("e2e_ms_p99", "e2e_ms_p50", "tpot_ms_p50", "ttft_ms_mean")}


def same_as_control(prompts: int = 200, positions: int = 10) -> TeacherForcedScores:
    """Teacher-forced scores of a candidate whose distributions equal the control's at every position."""
    n = np.full(prompts, float(positions))
    nll = RNG.uniform(5, 20, prompts)
    return TeacherForcedScores(np.zeros(prompts), n, n.copy(), nll, nll.copy(), n.copy(),
                               np.zeros(prompts * positions), np.repeat(np.arange(prompts), positions))


def arm(name: str, e2e: np.ndarray = E2E, scores: np.ndarray = SCORES, extra: dict | None = None,
        digests: tuple[str, str] = ("req", "prm"), teacher_forced: TeacherForcedScores | None = None) -> ArmResult:
    records = [RequestRecord(id=f"r{i}", scheduled_at=0.0, input_tokens=8, requested_output_tokens=16,
                             sent_at=0.0, first_token_at=0.2 * t, finished_at=t, output_tokens=16, ok=True)
               for i, t in enumerate(e2e)]
    agreement = {"quality/bleu_vs_control": 100.0, "quality/rougeL_vs_control": 1.0}  # same text as the control
    metrics = compute_metrics(records) | {m: float(np.mean(scores)) for m in QUALITY} | agreement | (extra or {})
    return ArmResult(name=name, metrics=metrics, records=records,
                     quality_per_prompt={m: list(scores) for m in QUALITY}, outputs=[],
                     requests_digest=digests[0], prompts_digest=digests[1],
                     teacher_forced=same_as_control() if teacher_forced is None else teacher_forced)


def by_name(verdict) -> dict:
    return {g.name: g for g in verdict.gates}


def test_identical_arms_pass() -> None:
    v = decide(arm("control"), arm("candidate"), GateConfig(run_noise=QUIET), candidate_lossless=False)
    assert (v.status, v.exit_code) == ("pass", 0)
    q = by_name(v)["quality_non_inferiority:quality/bleu_vs_ref"]
    assert (q.interval.low, q.interval.high) == (0.0, 0.0)
    assert "margin -0.30%" in q.reason
    json.dumps(v.to_dict())  # verdict.json must serialize


def test_clear_quality_drop_fails() -> None:
    v = decide(arm("control"), arm("candidate", scores=SCORES * 0.8), GateConfig(), False)
    assert (v.status, v.exit_code) == ("fail", 1)
    q = by_name(v)["quality_non_inferiority:quality/rougeL_vs_ref"]
    assert q.status == "fail" and q.interval.high == pytest.approx(-0.2)
    assert "-20.00%" in q.reason


def test_noisy_tiny_samples_are_inconclusive() -> None:
    rng = np.random.default_rng(5)
    ctrl = rng.uniform(30, 70, 12)
    noise = rng.normal(0, 15, 12)
    cand = ctrl + noise - noise.mean()  # no change on average, but far too noisy to show it
    e2e = rng.lognormal(0, 0.5, 12)
    cfg = GateConfig(latency_max_regression={"perf/e2e_ms_p50": 0.0}, control_agreement_min={}, run_noise=QUIET,
                     **NO_TF)
    v = decide(arm("c", e2e, ctrl), arm("k", e2e * rng.lognormal(0, 0.4, 12), cand), cfg, False)
    assert (v.status, v.exit_code) == ("inconclusive", 2)
    assert {g.status for g in v.gates} == {"inconclusive"}
    # fewer requests than gate.min_pairs: inconclusive however the interval looks
    v = decide(arm("c", E2E[:5]), arm("k", E2E[:5] * 2), GateConfig(quality_margins_rel={}, control_agreement_min={},
                                                                run_noise=QUIET), False)
    assert v.exit_code == 2 and "only 5 requests ok in every run" in v.gates[0].reason


def test_unmeasured_metric_is_inconclusive_never_pass() -> None:
    cfg = GateConfig(memory_ceilings_gb={"perf/peak_mem_gb": 80})
    v = decide(arm("c"), arm("k"), cfg, candidate_lossless=True)
    assert v.status == "inconclusive"
    g = by_name(v)
    assert g["memory_ceiling:perf/peak_mem_gb"].status == "inconclusive"
    assert "not measured in the control and candidate arms" in g["memory_ceiling:perf/peak_mem_gb"].reason
    assert g["exact_match:quality/exact_match_vs_control"].status == "inconclusive"
    c = arm("c")
    c.metrics.pop("perf/e2e_ms_p99")
    assert by_name(decide(c, arm("k"), GateConfig(), False))[
        "latency_max_regression:perf/e2e_ms_p99"].status == "inconclusive"


def test_latency_gates_on_paired_bootstrap() -> None:
    cfg = GateConfig(latency_gains={"perf/tpot_ms_p50": 0.3, "perf/ttft_ms_mean": 0.0},
                     latency_max_regression={"perf/e2e_ms_p99": 0.10}, run_noise=QUIET)
    v = decide(arm("c"), arm("k", E2E * 0.5), cfg, False)
    assert v.status == "pass"
    g = by_name(v)["latency_gain:perf/tpot_ms_p50"]
    assert g.interval.estimate == pytest.approx(-0.5) and "at least 30.00% better" in g.reason
    v = decide(arm("c"), arm("k", E2E * 1.3), cfg, False)
    assert v.status == "fail"
    assert by_name(v)["latency_max_regression:perf/e2e_ms_p99"].status == "fail"


def with_runs(a: ArmResult, *factors: float) -> ArmResult:
    """The arm run once per factor, every request of a run scaled by it (one run's luck)."""
    a.runs = [[replace(r, sent_at=0.0, first_token_at=r.first_token_at * f, finished_at=r.finished_at * f)
               for r in a.records] for f in factors]
    return a


def test_latency_needs_run_to_run_noise_from_repeats_or_an_aa_prior() -> None:
    cfg = GateConfig(quality_margins_rel={}, control_agreement_min={})
    v = decide(arm("c"), arm("k"), cfg, False)  # one run each, no prior: identical, and still undecided
    assert v.status == "inconclusive" and "run-to-run noise is unmeasured" in v.gates[0].reason
    # two pairs whose luck differs by 6% in opposite directions: identical arms, yet not a pass at 10%
    v = decide(with_runs(arm("c"), 1.0, 1.06), with_runs(arm("k"), 1.06, 1.0), cfg, False)
    g = v.gates[0]
    assert g.status == "inconclusive" and g.interval.pairs == 2 and g.interval.low < 0 < g.interval.high
    assert "over 2 run pair(s)" in g.reason
    # the same pairs with a consistent 30% slowdown: that is decided
    v = decide(with_runs(arm("c"), 1.0, 1.02), with_runs(arm("k"), 1.3, 1.3 * 1.02), cfg, False)
    assert v.status == "fail" and v.gates[0].interval.estimate == pytest.approx(0.3)
    # and a prior from an A/A sweep lets a single pair decide a large change
    one = GateConfig(quality_margins_rel={}, control_agreement_min={}, run_noise={"perf/e2e_ms_p99": 0.05},
                     run_noise_weight=19)
    assert decide(arm("c"), arm("k", E2E * 1.5), one, False).status == "fail"
    assert decide(arm("c"), arm("k", E2E * 1.05), one, False).status == "inconclusive"


def test_point_value_gates_exact_match_and_memory() -> None:
    cfg = GateConfig(latency_gains={"perf/throughput_req_s": 0.1},
                     memory_ceilings_gb={"perf/peak_mem_gb": 80}, run_noise=QUIET)
    ctrl = arm("c", extra={"perf/peak_mem_gb": 70.0})
    ok = arm("k", E2E * 0.5, extra={"perf/peak_mem_gb": 79.0, "quality/exact_match_vs_control": 1.0})
    v = decide(ctrl, ok, cfg, candidate_lossless=True)
    assert v.status == "pass", [g.reason for g in v.gates]
    assert "point values" in by_name(v)["latency_gain:perf/throughput_req_s"].reason
    bad = arm("k", E2E * 1.05, extra={"perf/peak_mem_gb": 81.0, "quality/exact_match_vs_control": 0.95})
    g = by_name(decide(ctrl, bad, cfg, candidate_lossless=True))
    for name in ("latency_gain:perf/throughput_req_s", "memory_ceiling:perf/peak_mem_gb",
                 "exact_match:quality/exact_match_vs_control"):
        assert g[name].status == "fail", g[name].reason
    # the exact-match gate applies only to lossless candidates
    assert "exact_match:quality/exact_match_vs_control" not in by_name(decide(ctrl, bad, cfg, False))


def test_point_quality_without_per_prompt_scores() -> None:
    c, k = arm("c"), arm("k")
    c.quality_per_prompt, k.quality_per_prompt = {}, {}
    k.metrics["quality/bleu_vs_ref"] = c.metrics["quality/bleu_vs_ref"] * 0.99
    g = by_name(decide(c, k, GateConfig(), False))["quality_non_inferiority:quality/bleu_vs_ref"]
    assert g.status == "fail" and "point values" in g.reason


@pytest.mark.parametrize("digests", [("other", "prm"), ("req", "other")])
def test_digest_mismatch_is_refused(digests: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="identical traffic and prompts"):
        decide(arm("c"), arm("k", digests=digests), GateConfig(), False)


def test_unknown_metric_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'perf/e2e_p99'.*perf/e2e_ms_p99.*capacity/\*"):
        GateConfig.from_dict({"latency_max_regression": {"perf/e2e_p99": 0.1}})
    with pytest.raises(ValueError, match="unknown gate key.*'latency_gain'.*valid: quality_margins_rel"):
        GateConfig.from_dict({"latency_gain": {}})
    with pytest.raises(ValueError, match="no control value"):
        GateConfig.from_dict({"quality_margins_rel": {"quality/bleu_vs_control": 0.01}})
    with pytest.raises(ValueError, match="not a memory metric"):
        GateConfig.from_dict({"memory_ceilings_gb": {"perf/e2e_ms_p99": 1}})
    with pytest.raises(ValueError, match="must be a number"):
        GateConfig.from_dict({"latency_gains": {"perf/ttft_ms_p50": "fast"}})


def test_metric_set_and_directions() -> None:
    assert len([m for m in METRICS if m.startswith(("perf/ttft", "perf/tpot", "perf/itl", "perf/e2e"))]) == 20
    assert validate_metric("capacity/concurrency_at_p99_3s") and validate_metric("stage/prefill_ms_mean")
    assert not higher_is_better("perf/e2e_ms_p99") and not higher_is_better("perf/peak_mem_gb")
    assert higher_is_better("perf/throughput_out_tok_s") and higher_is_better("quality/rougeL_vs_ref")
    cfg = GateConfig.from_dict({"latency_gains": {"perf/tpot_ms_p50": 0}, "n_boot": 500})
    assert cfg.latency_gains == {"perf/tpot_ms_p50": 0.0}
    assert cfg.quality_margins_rel["quality/bleu_vs_ref"] == 0.003 and cfg.n_boot == 500


def test_rollout_plan_only_for_pass() -> None:
    v = decide(arm("c"), arm("k"), GateConfig(run_noise=QUIET), False)
    plan = rollout_plan(v, "k")
    assert [s["candidate_weight_pct"] for s in plan["stages"]] == [1, 5, 25, 50, 100]
    assert "latency_max_regression:perf/e2e_ms_p99" in plan["stages"][0]["recheck_gates"]
    with pytest.raises(ValueError, match="end at 100"):
        rollout_plan(v, "k", stages=(1, 50))
    with pytest.raises(ValueError, match="'fail'"):
        rollout_plan(decide(arm("c"), arm("k", scores=SCORES * 0.8), GateConfig(), False), "k")


def test_promote_and_rollback(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    assert current(reg) is None
    promote(reg, {"opts": ["paged_kv"]}, run_id="run1", name="paged_kv")
    with pytest.raises(ValueError, match="nothing to roll back to"):
        rollback(reg)
    promote(reg, {"opts": ["paged_kv", "flash_attn"]}, run_id="run2", name="flash_attn")
    assert current(reg)["run_id"] == "run2"
    back = rollback(reg)
    assert back["run_id"] == "run1" and back["snapshot"] == {"opts": ["paged_kv"]}
    assert current(reg)["run_id"] == "run1"
    with pytest.raises(ValueError, match="nothing to roll back to"):
        rollback(reg)
    assert len((reg / "history.jsonl").read_text().splitlines()) == 3  # the audit trail keeps all


def test_rollback_cli_restores_the_previous_promotion(tmp_path, capsys):
    from optladder.abtest.rollback import main as rollback_main
    from optladder.abtest.rollout import current, promote

    promote(tmp_path, {"overrides": ["+opt=paged_kv"]}, "run-1", "paged_kv")
    promote(tmp_path, {"overrides": ["+opt=[paged_kv,flash_attn]"]}, "run-2", "flash_attn")
    assert rollback_main(["--registry", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "run-1" in out and "python run.py '+opt=paged_kv'" in out
    assert current(tmp_path)["run_id"] == "run-1"
    assert rollback_main(["--registry", str(tmp_path)]) == 1  # nothing left to roll back to


def test_outputs_that_drift_from_the_control_fail_when_nothing_finer_was_measured() -> None:
    # a lossy candidate whose scores against the references do not drop, but whose answers changed, and whose
    # engine gave no teacher-forced scores: agreement with the control's text decides
    drifted = arm("k", extra={"quality/bleu_vs_control": 71.0, "quality/rougeL_vs_control": 0.83},
                  teacher_forced=TeacherForcedScores.not_measured("an endpoint without log-probs"))
    v = decide(arm("c"), drifted, GateConfig(), candidate_lossless=False)
    g = by_name(v)
    assert (v.status, v.exit_code) == ("fail", 1)
    assert g["control_agreement:quality/bleu_vs_control"].status == "fail"
    assert g["control_agreement:quality/bleu_vs_control"].decides
    assert "71" in g["control_agreement:quality/bleu_vs_control"].reason
    assert g["quality_non_inferiority:quality/bleu_vs_ref"].status == "pass"
    tf = g["teacher_forced:quality/kl_vs_control_mean"]
    assert tf.status == "inconclusive" and "an endpoint without log-probs" in tf.reason
    # the same drift with teacher-forced scores equal to the control's: reported, and the candidate passes
    drifted.teacher_forced = same_as_control()
    v = decide(arm("c"), drifted, GateConfig(run_noise=QUIET), candidate_lossless=False)  # latency decides too
    g = by_name(v)
    assert (v.status, v.exit_code) == ("pass", 0)
    assert g["control_agreement:quality/bleu_vs_control"].status == "fail"
    assert not g["control_agreement:quality/bleu_vs_control"].decides
    unmeasured = arm("k")
    unmeasured.metrics.pop("quality/rougeL_vs_control")
    assert by_name(decide(arm("c"), unmeasured, GateConfig(), False))[
        "control_agreement:quality/rougeL_vs_control"].status == "inconclusive"


def test_agreement_gate_takes_only_agreement_scores() -> None:
    with pytest.raises(ValueError, match="not an agreement score"):
        GateConfig(control_agreement_min={"quality/bleu_vs_ref": 99.0})


def test_a_lossless_candidate_in_half_precision_is_decided_teacher_forced() -> None:
    # the H200 with random bf16 weights: flash_attn rewrote every greedy answer (0% equal), its distributions did not
    rewritten = {"quality/exact_match_vs_control": 0.0, "quality/bleu_vs_control": 8.6,
                 "quality/rougeL_vs_control": 0.10}
    cand = arm("k", extra=rewritten)
    exact = decide(arm("c"), cand, GateConfig(run_noise=QUIET), candidate_lossless=True, lossless_check="exact")
    assert exact.status == "fail" and by_name(exact)["exact_match:quality/exact_match_vs_control"].decides
    assert not any(g.gate == "teacher_forced" for g in exact.gates)  # exactly: no teacher-forced gate at all
    v = decide(arm("c"), cand, GateConfig(run_noise=QUIET), candidate_lossless=True, lossless_check="teacher_forced")
    g = by_name(v)
    assert (v.status, v.exit_code) == ("pass", 0)
    em = g["exact_match:quality/exact_match_vs_control"]
    assert em.status == "fail" and not em.decides and "rounding change" in em.reason
    assert not g["control_agreement:quality/bleu_vs_control"].decides
    assert g["teacher_forced:quality/kl_vs_control_mean"].status == "pass"
    # a broken kernel moves the distributions themselves: the teacher-forced gates fail it
    n = 200 * 10
    broken = TeacherForcedScores(np.full(200, 3.5), np.full(200, 10.0), np.full(200, 4.0), np.full(200, 10.0),
                                 np.full(200, 40.0), np.full(200, 10.0), np.full(n, 0.35),
                                 np.repeat(np.arange(200), 10))
    bad = decide(arm("c"), arm("k", extra=rewritten, teacher_forced=broken), GateConfig(run_noise=QUIET),
                 candidate_lossless=True, lossless_check="teacher_forced")
    assert bad.status == "fail" and by_name(bad)["teacher_forced:quality/kl_vs_control_mean"].status == "fail"
    # unmeasured teacher-forced scores never pass, and the exact-match gate decides again
    none = decide(arm("c"), arm("k", extra=rewritten, teacher_forced=TeacherForcedScores.not_measured("no logits")),
                  GateConfig(run_noise=QUIET), candidate_lossless=True, lossless_check="teacher_forced")
    assert none.status == "fail" and by_name(none)["exact_match:quality/exact_match_vs_control"].decides


def test_lossless_check_is_validated_naming_the_valid_values() -> None:
    with pytest.raises(ValueError, match="gate.lossless_check=.teacher. is not one of auto, near_tie, exact, teacher_forced"):
        GateConfig(lossless_check="teacher")


def test_random_weights_are_decided_by_the_kl_alone() -> None:
    # flash_attn on the H200, random bf16 weights: KL 0.002 but top-1 agreement 88% (near-ties everywhere)
    n, pos = 200, 10
    ties = TeacherForcedScores(np.full(n, 0.002 * pos), np.full(n, float(pos)), np.full(n, 0.88 * pos),
                               np.full(n, 10.0), np.full(n, 10.0), np.full(n, float(pos)),
                               np.full(n * pos, 0.002), np.repeat(np.arange(n), pos))
    cand = arm("k", extra={"quality/exact_match_vs_control": 0.0}, teacher_forced=ties)
    real = decide(arm("c"), cand, GateConfig(run_noise=QUIET), True, "teacher_forced")
    assert real.status == "fail" and by_name(real)["teacher_forced:quality/top1_agree_vs_control"].decides
    rand = decide(arm("c"), cand, GateConfig(run_noise=QUIET), True, "teacher_forced", random_weights=True)
    g = by_name(rand)
    assert rand.status == "pass"
    top1 = g["teacher_forced:quality/top1_agree_vs_control"]
    assert top1.status == "fail" and not top1.decides and "random weights" in top1.reason
    assert g["teacher_forced:quality/kl_vs_control_mean"].decides
    # a KL beyond the bound still fails a random-weight candidate
    far = replace(ties, kl_sum=np.full(n, 0.5 * pos), token_kl=np.full(n * pos, 0.5))
    assert decide(arm("c"), arm("k", teacher_forced=far), GateConfig(run_noise=QUIET), True, "teacher_forced",
                  random_weights=True).status == "fail"


def test_a_switch_teacher_forcing_does_not_run_keeps_its_exact_match_an_undecided_one() -> None:
    rewritten = {"quality/exact_match_vs_control": 0.0, "quality/bleu_vs_control": 16.0,
                 "quality/rougeL_vs_control": 0.18}
    v = decide(arm("c"), arm("k", extra=rewritten), GateConfig(run_noise=QUIET), True, "teacher_forced",
               tf_covers=False)  # dynamic_batching on the H200: 0% equal, scores identical by construction
    em = by_name(v)["exact_match:quality/exact_match_vs_control"]
    assert v.status == "inconclusive" and em.decides and em.status == "inconclusive"
    assert "cannot be told from rounding" in em.reason
    same = decide(arm("c"), arm("k", extra={"quality/exact_match_vs_control": 1.0}), GateConfig(run_noise=QUIET),
                  True, "teacher_forced", tf_covers=False)
    assert same.status == "pass"


def test_a_lossless_candidate_without_teacher_forced_scores_is_decided_by_its_exact_match() -> None:
    perfect = arm("k", extra={"quality/exact_match_vs_control": 1.0},
                  teacher_forced=TeacherForcedScores.not_measured("an endpoint without prompt_logprobs"))
    v = decide(arm("c"), perfect, GateConfig(run_noise=QUIET), True, "teacher_forced")
    assert v.status == "pass"
    tf = by_name(v)["teacher_forced:quality/kl_vs_control_mean"]
    assert tf.status == "inconclusive" and not tf.decides


def test_the_random_weights_rule_leaves_lossy_candidates_alone() -> None:
    n, pos = 200, 10
    ties = TeacherForcedScores(np.full(n, 0.002 * pos), np.full(n, float(pos)), np.full(n, 0.88 * pos),
                               np.full(n, 10.0), np.full(n, 10.0), np.full(n, float(pos)),
                               np.full(n * pos, 0.002), np.repeat(np.arange(n), pos))
    v = decide(arm("c"), arm("k", teacher_forced=ties), GateConfig(run_noise=QUIET), False, random_weights=True)
    top1 = by_name(v)["teacher_forced:quality/top1_agree_vs_control"]
    assert v.status == "fail" and top1.decides
