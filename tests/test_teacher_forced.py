"""Teacher-forced measures: the per-position comparison against hand-computed values, the bootstrap gates on
synthetic prompts with known answers, vLLM's prompt_logprobs parsing, and both arms of real engines scoring
the same sequences (an identical candidate measures zero, a damaged one fails; an endpoint without
log-probs is unmeasured, never passed)."""
from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from optladder.abtest.gates import GateConfig
from optladder.abtest.teacher_forced import KL_MEAN, KL_P99, PPL, TOP1, intervals, teacher_forced_checks
from optladder.backends.scoring import ScoringUnavailable, _parse, prompt_logprobs
from optladder.quality.prompts import PromptItem
from optladder.quality.teacher_forced import (Accumulator, TeacherForcedScores, TokenLogprobs, build_sequences, compare,
                                    to_metrics)

RNG = np.random.default_rng(0)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)


def test_full_comparison_against_hand_computed_values():
    p = np.log(np.array([[0.5, 0.25, 0.25], [0.9, 0.05, 0.05]], dtype=np.float32))
    q = np.log(np.array([[0.25, 0.5, 0.25], [0.9, 0.05, 0.05]], dtype=np.float32))
    stats, approx = compare(TokenLogprobs.from_full(p, [1, 0]), TokenLogprobs.from_full(q, [1, 0]))
    assert not approx
    assert stats.kl == pytest.approx([0.25 * np.log(2), 0.0], abs=1e-7)  # 0.5 ln 2 - 0.25 ln 2
    assert stats.top1_agree.tolist() == [False, True]
    assert stats.control_nll == pytest.approx([np.log(4), -np.log(0.9)], rel=1e-6)
    assert stats.candidate_nll == pytest.approx([np.log(2), -np.log(0.9)], rel=1e-6)


def test_topk_kl_is_a_lower_bound_and_exact_with_the_whole_vocabulary():
    p = log_softmax(RNG.normal(0, 2, (30, 200)))
    q = log_softmax(np.log(np.exp(p)) + RNG.normal(0, 0.3, (30, 200)))
    exact = compare(TokenLogprobs.from_full(p, [0] * 30), TokenLogprobs.from_full(q, [0] * 30))[0].kl
    means = {}
    for k in (200, 20, 3):
        top = TokenLogprobs(p[:, 0], None, *TokenLogprobs.from_full(p, [0] * 30).topk(k))
        # the candidate with its full distribution, or with a top-k list holding every token
        for cand in (TokenLogprobs.from_full(q, [0] * 30), TokenLogprobs(q[:, 0], None, *TokenLogprobs.from_full(
                q, [0] * 30).topk(200))):
            approx, is_approx = compare(top, cand)
            assert is_approx and (approx.kl <= exact + 1e-6).all()  # merging the tail never adds divergence
            means[k] = approx.kl.mean()
    assert means[200] == pytest.approx(exact.mean(), abs=1e-6) and means[3] < means[20] < means[200]


def test_sequences_and_sums_per_prompt():
    seqs = build_sequences([[1, 2], [3], []], [[7, 8, 9], [], [5]], [[4], [6, 6], [5]])
    assert [(s.prompt_index, s.kind, s.token_ids, s.start) for s in seqs] == [
        (0, "reference", [1, 2, 7, 8, 9], 2), (0, "control_output", [1, 2, 4], 2), (1, "control_output", [3, 6, 6], 1)]
    acc = Accumulator(3)
    for s in seqs:
        n = len(s.token_ids) - s.start
        lp = log_softmax(np.zeros((n, 4)))
        acc.add(s, compare(TokenLogprobs.from_full(lp, [0] * n), TokenLogprobs.from_full(lp, [0] * n))[0])
    tf = acc.result()
    assert tf.positions.tolist() == [4, 2, 0] and tf.ref_tokens.tolist() == [3, 0, 0]
    assert tf.ref_nll_control == pytest.approx([3 * np.log(4), 0, 0])
    m = to_metrics(tf)
    assert m["quality/kl_vs_control_mean"] == 0 and m["quality/ppl_ref_rel_change"] == pytest.approx(0.0)
    assert m["quality/ppl_ref_control"] == pytest.approx(4.0)


def synthetic(kl_per_position: float, agree: float, ppl_change: float, prompts: int = 200, positions: int = 30,
              seed: int = 0) -> TeacherForcedScores:
    """Per-position KL drawn around a mean, top-1 agreement and a reference log-likelihood shift, per prompt."""
    rng = np.random.default_rng(seed)
    token_kl = rng.exponential(kl_per_position, prompts * positions)
    token_prompt = np.repeat(np.arange(prompts), positions)
    n = np.full(prompts, float(positions))
    nll_c = rng.uniform(10, 40, prompts)
    nll_k = nll_c + np.log1p(ppl_change) * positions + rng.normal(0, 0.05, prompts)
    return TeacherForcedScores(np.bincount(token_prompt, token_kl), n, rng.binomial(positions, agree, prompts) * 1.0,
                               nll_c, nll_k, n.copy(), token_kl, token_prompt)


def statuses(tf: TeacherForcedScores, cfg: GateConfig = GateConfig()) -> dict[str, str]:
    return {c.metric: c.status for c in teacher_forced_checks(tf, cfg.teacher_forced_bounds(), 500, 0, 0.05, 10)}


def test_intervals_cover_the_point_and_narrow_with_more_prompts():
    tf = synthetic(0.003, 0.99, 0.005)
    iv = intervals(tf, n_boot=500)
    assert set(iv) == {KL_MEAN, KL_P99, TOP1, PPL}
    for m in iv.values():
        assert m.low <= m.estimate <= m.high and m.n == 200
    assert iv[KL_MEAN].estimate == pytest.approx(tf.token_kl.mean())
    assert iv[KL_P99].estimate == np.quantile(tf.token_kl, 0.99, method="inverted_cdf")
    assert iv[PPL].estimate == pytest.approx(0.005, abs=0.001)
    wide = intervals(synthetic(0.003, 0.99, 0.005, prompts=20), n_boot=500)[KL_MEAN]
    assert wide.high - wide.low > 2 * (iv[KL_MEAN].high - iv[KL_MEAN].low)


def test_gates_pass_fail_and_undecided_with_their_numbers():
    assert set(statuses(synthetic(0.001, 0.995, 0.0)).values()) == {"pass"}
    bad = statuses(synthetic(0.35, 0.80, 0.27))
    assert bad == {KL_MEAN: "fail", KL_P99: "fail", TOP1: "fail", PPL: "fail"}
    near = statuses(synthetic(0.0098, 0.995, 0.0, prompts=15))  # the interval straddles kl_max_mean
    assert near[KL_MEAN] == "inconclusive"
    check = teacher_forced_checks(synthetic(0.35, 0.8, 0.27), {TOP1: 0.97}, 200, 0, 0.05, 10)[0]
    assert check.reason.startswith("quality/top1_agree_vs_control: 79.32% [95% CI 78.")
    assert "200 prompts, 6000 positions]; required at least 97.00% -> fail" in check.reason


def test_unmeasured_or_too_few_prompts_never_pass():
    out = statuses(TeacherForcedScores.not_measured("the endpoint returned no prompt_logprobs"))
    assert set(out.values()) == {"inconclusive"}
    few = statuses(synthetic(0.0001, 1.0, 0.0, prompts=5))
    assert set(few.values()) == {"inconclusive"}
    assert statuses(None) == {m: "inconclusive" for m in (KL_MEAN, KL_P99, TOP1, PPL)}
    assert statuses(synthetic(0.5, 0.5, 0.5), GateConfig(kl_max_mean=None, kl_max_p99=None, top1_agree_min=None,
                                                         ppl_max_rel_increase=None)) == {}


def test_vllm_prompt_logprobs_are_parsed_by_token_id():
    ids = [5, 9, 11, 9]
    entries = [None, {"9": {"logprob": -0.1, "rank": 1}, "4": {"logprob": -2.5, "rank": 2}},
               {"11": {"logprob": -3.0, "rank": 3}, "2": {"logprob": -0.5, "rank": 1},
                "9": {"logprob": -1.0, "rank": 2}},
               {"9": {"logprob": -0.2, "rank": 1}}]
    out = _parse(entries, ids, 2, k=2)
    assert out.target.tolist() == [-3.0, -0.2]
    assert out.topk_ids.tolist() == [[2, 9], [9, 9]] and out.topk_logprobs.tolist() == [[-0.5, -1.0], [-0.2, -0.2]]
    with pytest.raises(ScoringUnavailable, match="lacks the prompt's own token 11"):
        _parse([None, None, {"3": {"logprob": -1.0}}], [1, 2, 11], 2, k=2)


class _NoLogprobs(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"choices": [{"text": "x"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_endpoint_without_prompt_logprobs_is_unavailable():
    server = HTTPServer(("127.0.0.1", 0), _NoLogprobs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ScoringUnavailable, match="returned no prompt_logprobs"):
            prompt_logprobs(f"http://127.0.0.1:{server.server_port}", "m", [[1, 2, 3]], [1])
    finally:
        server.shutdown()


@pytest.mark.usefixtures("one_torch_thread")
def test_real_engines_identical_measure_zero_and_damaged_fail():
    from optladder.backends.engines import ReferenceBackend
    from optladder.engine.config import EngineConfig
    from optladder.experiments.teacher_forced_run import score_pair
    from tests.test_quant import BASE, TINY

    items = [PromptItem(f"p{i}", f"question {i}: what is {i} + {i}?", [f"it is {2 * i}"]) for i in range(12)]
    outputs = [f"{2 * i}, I think" for i in range(12)]
    control = ReferenceBackend(TINY, EngineConfig(**BASE))
    same = score_pair(control, ReferenceBackend(TINY, EngineConfig(**BASE)), items, outputs, 128, progress=False)
    assert same.positions.sum() > 12 * 10 and same.kl_sum.sum() == 0 and (same.top1_agree == same.positions).all()
    damaged = ReferenceBackend(replace(TINY, damage="round_bits:2"), EngineConfig(**BASE))
    tf = score_pair(control, damaged, items, outputs, 128, progress=False)
    assert tf.approximated is None and tf.positions.tolist() == same.positions.tolist()
    out = statuses(tf)
    assert out[KL_MEAN] == out[KL_P99] == out[TOP1] == "fail", out  # a random model's perplexity is ~its vocabulary
    short = score_pair(control, damaged, items, outputs, 40, progress=False)  # sequences over max_len are skipped
    assert short.skipped > 0 and short.positions.sum() < tf.positions.sum()


def test_the_comparison_on_torch_tensors_equals_the_numpy_one():
    import torch

    p = log_softmax(RNG.normal(0, 2, (40, 300)))
    q = log_softmax(np.log(np.exp(p) + RNG.uniform(0, 0.02, p.shape)))
    targets = RNG.integers(0, 300, 40).tolist()
    a = compare(TokenLogprobs.from_full(p, targets), TokenLogprobs.from_full(q, targets))[0]
    b, approx = compare(TokenLogprobs.from_tensor(torch.from_numpy(p), targets),
                        TokenLogprobs.from_tensor(torch.from_numpy(q), targets))
    assert not approx and a.kl.min() > 1e-4  # the arms really differ
    np.testing.assert_allclose(b.kl, a.kl, rtol=1e-6)
    np.testing.assert_array_equal(b.top1_agree, a.top1_agree)
    np.testing.assert_array_equal(b.control_nll, a.control_nll)
    # one arm with only its top-k: the tensor side comes to the host, the approximate comparison as before
    k = 5
    topk = TokenLogprobs(q[np.arange(40), targets], None, *TokenLogprobs.from_full(q, targets).topk(k))
    c = compare(TokenLogprobs.from_tensor(torch.from_numpy(p), targets), topk)
    d = compare(TokenLogprobs.from_full(p, targets), topk)
    assert c[1] and d[1]
    np.testing.assert_allclose(c[0].kl, d[0].kl, rtol=1e-12)
    # and a tensor's own top-k, as a top-k-only engine would hand it out, is the array's
    t = TokenLogprobs.from_tensor(torch.from_numpy(p), targets).topk(k)
    np.testing.assert_array_equal(t[0], TokenLogprobs.from_full(p, targets).topk(k)[0])


def test_the_tensor_comparison_in_row_chunks_equals_one_pass(monkeypatch):
    import torch

    import optladder.quality.teacher_forced as tfm

    p = log_softmax(RNG.normal(0, 2, (50, 64)))
    q = log_softmax(RNG.normal(0, 2, (50, 64)))
    whole = tfm.compare_full_tensor(torch.from_numpy(p), torch.from_numpy(q), p[:, 0], q[:, 0])
    monkeypatch.setattr(tfm, "ROWS", 7)  # 50 rows in 8 chunks, the last one short
    chunked = tfm.compare_full_tensor(torch.from_numpy(p), q, p[:, 0], q[:, 0])  # one side numpy
    np.testing.assert_array_equal(chunked.kl, whole.kl)
    np.testing.assert_array_equal(chunked.top1_agree, whole.top1_agree)
    assert len(chunked.kl) == 50
