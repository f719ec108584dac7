"""The near-tie lossless check (optladder/quality/near_tie.py) and its gate, on hand-made traces, and the engine's
recording of top-k log-probs that feeds it."""
import math

import pytest

from optladder.abtest.gates import GateConfig
from optladder.abtest.lossless import arms_lossless, lossless_check
from optladder.abtest.verdict import _near_tie_gate
from optladder.quality.near_tie import GreedyTrace, compare, unavailable


def tr(tokens, tops):
    return GreedyTrace(tokens, [list(row) for row in tops])


# position 0 agrees; at position 1 the control chose 7 over 8 by 0.05 nats, the candidate 8 over 7 by 0.04
CTRL = tr([5, 7, 9], [[(5, -0.1), (6, -3.0)], [(7, -0.70), (8, -0.75), (1, -4.0)], [(9, -0.2)]])
NEAR = tr([5, 8, 2], [[(5, -0.1), (6, -3.0)], [(8, -0.71), (7, -0.75), (1, -4.0)], [(2, -0.3)]])


def test_a_fork_at_a_near_tie_passes_and_the_rest_of_the_answer_is_not_compared():
    rep = compare([CTRL, CTRL], [NEAR, CTRL], top_k=5, margin=1.0, prompt_ids=["a", "b"])
    assert (rep.equal, rep.diverged, rep.near_ties, rep.offenders) == (1, 1, 1, [])
    fork = rep.forks[0]
    assert (fork.prompt_id, fork.position, fork.control_token, fork.candidate_token) == ("a", 1, 7, 8)
    assert fork.control_margin == pytest.approx(0.05) and fork.candidate_margin == pytest.approx(0.04)
    assert rep.max_drift == pytest.approx(0.0)  # position 0: -0.1 in both
    g = _near_tie_gate(rep)
    assert g.status == "pass" and "1 part from it, 1 of those at a near-tie" in g.reason


def test_a_token_far_below_the_other_arms_top_fails_naming_prompt_and_position():
    far = tr([5, 1, 2], [[(5, -0.1)], [(1, -0.2), (7, -3.0)], [(2, -0.3)]])  # the control's 1 is 3.8 nats down
    rep = compare([CTRL], [far], top_k=5, margin=1.0, prompt_ids=["p17"])
    assert len(rep.offenders) == 1 and rep.offenders[0].control_margin == pytest.approx(3.3)
    g = _near_tie_gate(rep)
    assert g.status == "fail" and "prompt 'p17' at output position 1" in g.reason


def test_each_direction_is_checked_and_top_k_limits_what_counts():
    # the candidate's token is a near-tie under the control, but the control's 7 is outside the candidate's top-k
    one_sided = tr([5, 8], [[(5, -0.1)], [(8, -0.1), (3, -0.2), (4, -0.3)]])
    rep = compare([CTRL], [one_sided], top_k=5, margin=1.0)
    assert rep.offenders and math.isinf(rep.offenders[0].candidate_margin)
    assert rep.offenders[0].control_margin == pytest.approx(0.05)
    # token 8 is the control's second choice: with top_k=1 it no longer counts
    assert compare([CTRL], [NEAR], top_k=1, margin=1.0).offenders
    assert not compare([CTRL], [NEAR], top_k=2, margin=1.0).offenders
    assert compare([CTRL], [NEAR], top_k=5, margin=0.01).offenders  # 0.05 nats > 0.01


def test_an_answer_that_stops_early_is_a_fork_at_its_end():
    short = tr([5], [[(5, -0.1), (6, -3.0)]])
    rep = compare([CTRL], [short], top_k=5, margin=1.0)
    assert rep.diverged == 1 and rep.offenders and rep.forks[0].position == 1
    nothing = compare([None], [None], 5, 1.0)  # no room to answer in either arm: nothing compared, not equal
    assert nothing.equal == 0 and _near_tie_gate(nothing).status == "inconclusive"


def test_no_log_probs_is_inconclusive_with_the_reason_never_pass():
    g = _near_tie_gate(unavailable(3, 5, 1.0, "the server refused logprobs"))
    assert g.status == "inconclusive" and "refused logprobs" in g.reason
    assert _near_tie_gate(None).status == "inconclusive"


def test_traces_round_trip_through_json_unrounded():
    import json

    odd = tr([5], [[(5, -0.123456789), (6, -1.000000001)]])
    for t in (NEAR, odd):
        back = GreedyTrace.from_dict(json.loads(json.dumps(t.to_dict())))
        assert back.tokens == t.tokens and back.top == [[tuple(x) for x in row] for row in t.top]


def test_auto_picks_near_tie_where_both_arms_recorded_traces_else_as_before():
    assert lossless_check("auto", ("bfloat16", "bfloat16"))[0] == "near_tie"
    assert lossless_check("auto", ("float32", "float32"))[0] == "near_tie"
    assert lossless_check("auto", ("bfloat16", "bfloat16"), "engine=x records none")[0] == "teacher_forced"
    assert lossless_check("auto", ("float32", "float32"), "engine=x records none")[0] == "exact"


def test_a_planted_bug_rides_on_a_lossless_switch_and_the_gate_keys_are_validated():
    ok, why = arms_lossless({"engine": {"flash_attn": False}}, {"engine": {"flash_attn": True, "debug_plant": "x"}})
    assert ok, why
    assert arms_lossless({"engine": {}}, {"engine": {}})[1] == "lossless: the arms' configs are identical"
    with pytest.raises(ValueError, match="gate.near_tie_top_k must be an integer in \\[1, 5\\]"):
        GateConfig(near_tie_top_k=9)
    with pytest.raises(ValueError, match="gate.near_tie_margin"):
        GateConfig(near_tie_margin=-1.0)


def test_the_engine_records_the_distribution_each_greedy_token_was_chosen_from():
    """The reference engine's recorded top-k: the chosen token is the top one, log-probs are normalised and
    sorted, one row per answer token, also with drafts verified several at a time (speculative)."""
    from test_server import TINY

    from optladder.engine.config import EngineConfig, SpeculativeConfig
    from optladder.engine.llm_engine import LLMEngine
    from optladder.engine.sequence import SamplingParams

    for spec in (SpeculativeConfig(), SpeculativeConfig("ngram")):
        engine = LLMEngine(TINY, EngineConfig(device="cpu", max_model_len=256, kv_cache_gb=0.05, paged_kv=True,
                                              dynamic_batching=True, speculative=spec))
        prompts = [[3, 4, 5, 3, 4, 5, 3, 4], [9, 10, 11, 12]]
        seqs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, logprobs=3))
        for s in seqs:
            assert len(s.top_logprobs) == s.num_output_tokens == 12
            for tok, (ids, lps) in zip(s.output_token_ids, s.top_logprobs):
                assert ids[0] == tok and len(ids) == 3 and lps == sorted(lps, reverse=True) and lps[0] <= 0
        if spec:
            assert engine.speculator is not None
        plain = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4))
        assert all(s.top_logprobs == [] for s in plain)  # nothing recorded unless asked


def test_in_float32_a_drift_before_any_fork_fails_even_when_every_fork_is_a_near_tie():
    drifted = tr([5, 8, 2], [[(5, -0.3), (6, -3.0)], [(8, -0.71), (7, -0.75), (1, -4.0)], [(2, -0.3)]])
    rep = compare([CTRL], [drifted], top_k=5, margin=1.0)
    assert not rep.offenders and rep.max_drift == pytest.approx(0.2)
    assert _near_tie_gate(rep).status == "pass"  # half precision: drift is rounding, reported
    g = _near_tie_gate(rep, max_drift=0.01)
    assert g.status == "fail" and "gate.near_tie_max_drift_float32=0.01" in g.reason
    assert _near_tie_gate(compare([CTRL], [NEAR], 5, 1.0), max_drift=0.01).status == "pass"
