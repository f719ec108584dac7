"""Arrival schedules, exact-length prompts with shared prefixes, and whole workloads."""
import json
import re

import numpy as np
import pytest

from tests.conftest import data_root
from optladder.traffic.arrivals import gamma_arrivals, mean_rate, poisson_arrivals, trace_arrivals
from optladder.traffic.materialize import build_pool, materialize, prefix_groups, prompt_texts
from optladder.traffic.request import requests_digest
from optladder.traffic.sampling import stratified_sample
from optladder.traffic.traces import TraceRow, load_trace
from optladder.traffic.workload import WorkloadConfig, build_workload

AZURE_FILE = "traces/azure_conv_2023.csv"


class CharTokenizer:
    """One token per character: stateless and fast; decode(encode(x)) == x, which real ones do not
    promise, so nothing here may rely on it (lengths are checked on the ids)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


TOK = CharTokenizer()


def write_jsonl(tmp_path, name, rows):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


# --- arrivals ---
def test_poisson_and_gamma_hit_the_rate():
    for times in (poisson_arrivals(20000, 4.0, seed=1), gamma_arrivals(20000, 4.0, cv=2.0, seed=1)):
        assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
        assert mean_rate(times) == pytest.approx(4.0, rel=0.05)
    gaps = np.diff(gamma_arrivals(20000, 4.0, cv=2.0, seed=2))
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.1)
    assert poisson_arrivals(50, 1.0, seed=3) == poisson_arrivals(50, 1.0, seed=3)


def test_trace_arrivals_scale_the_gaps():
    assert trace_arrivals([10.0, 11.0, 13.5], 1.0) == [0.0, 1.0, 3.5]
    assert trace_arrivals([10.0, 11.0, 13.5], 2.0) == [0.0, 2.0, 7.0]
    with pytest.raises(ValueError, match="time order"):
        trace_arrivals([2.0, 1.0], 1.0)


@pytest.mark.parametrize("call, field", [
    (lambda: poisson_arrivals(5, 0.0, 0), "rate"), (lambda: gamma_arrivals(5, -1.0, 1.0, 0), "rate"),
    (lambda: gamma_arrivals(5, 1.0, 0.0, 0), "cv"), (lambda: trace_arrivals([0.0, 1.0], 0.0), "time_scale"),
    (lambda: poisson_arrivals(0, 1.0, 0), "n")])
def test_arrivals_reject_non_positive_values(call, field):
    with pytest.raises(ValueError, match=f"{field} must be"):
        call()


# --- materialization ---
def builtin_pool():
    texts, source = prompt_texts("builtin", None, TOK)
    return build_pool(texts, TOK, source)


def test_materialized_lengths_are_exact_and_seeded():
    pool = builtin_pool()
    rows = [TraceRow(0, n, 1) for n in (1, 7, 300, len(pool.ids) + 123)]  # the last one wraps the pool
    rows.append(TraceRow(0, 5, 1, prompt_text="a prompt longer than five"))
    rows.append(TraceRow(0, 12, 1, prompt_text="short"))  # topped up from the pool
    prompts = materialize(rows, pool, TOK, seed=0)
    assert [len(p) for p in prompts] == [r.input_len for r in rows]
    assert TOK.decode(prompts[4]) == "a pro" and TOK.decode(prompts[5]).startswith("short")
    assert prompts == materialize(rows, pool, TOK, seed=0)
    assert prompts[2] != materialize(rows, pool, TOK, seed=1)[2]
    assert prompts[1][:4] != prompts[2][:4]  # distinct window starts: no accidental shared prefix


def test_shared_hash_runs_share_exact_tokens():
    rows = [TraceRow(0, 24, 1, hash_ids=[1, 2, 3]), TraceRow(0, 20, 1, hash_ids=[1, 2, 4]),
            TraceRow(0, 16, 1, hash_ids=[5, 6]), TraceRow(0, 10, 1, hash_ids=[1, 7]),
            TraceRow(0, 30, 1, hash_ids=[1])]  # hash ids run out: the rest is its own
    p = materialize(rows, builtin_pool(), TOK, seed=0, block_tokens=8)
    assert [len(x) for x in p] == [24, 20, 16, 10, 30]
    assert p[0][:16] == p[1][:16] and p[0][16:20] != p[1][16:20]
    assert p[0][:8] == p[3][:8] == p[4][:8] and p[0][8:10] != p[3][8:10]
    assert p[2][:8] != p[0][:8]
    assert prefix_groups(rows) == ["hash-1", "hash-1", None, "hash-1", "hash-1"]


# --- workloads ---
def test_builtin_is_deterministic_and_needs_no_data(tmp_path, monkeypatch):
    monkeypatch.delenv("OPTLADDER_DATA", raising=False)
    cfg = WorkloadConfig(num_requests=40, seed=5)
    a = build_workload(cfg, TOK, max_model_len=512, data_root=str(tmp_path))
    b = build_workload(WorkloadConfig(num_requests=40, seed=5), TOK, max_model_len=512, data_root=None)
    assert requests_digest(a.requests) == requests_digest(b.requests)
    c = build_workload(WorkloadConfig(num_requests=40, seed=6), TOK, max_model_len=512, data_root=None)
    assert requests_digest(a.requests) != requests_digest(c.requests)
    assert a.mode == "open" and a.source.startswith("builtin") and "builtin_text.txt" in a.source
    assert [r.id for r in a.requests[:2]] == ["req-00000", "req-00001"]
    for r in a.requests:
        assert 32 <= r.input_len <= 384 and 8 <= r.output_len <= 96 and r.ignore_eos
    times = [r.scheduled_at for r in a.requests]
    assert times[0] == 0.0 and times == sorted(times)
    assert a.stats["traffic/num_requests"] == 40 and a.stats["traffic/mean_rate_req_s"] > 0


def test_builtin_fits_a_small_context():
    w = build_workload(WorkloadConfig(num_requests=20), TOK, max_model_len=64, data_root=None)
    assert all(r.input_len + r.output_len <= 64 for r in w.requests)
    assert w.stats["traffic/changed_lengths"] > 0 and any("max_model_len=64" in m for m in w.warnings)


def test_closed_mode_has_no_schedule():
    w = build_workload(WorkloadConfig(arrival="closed", concurrency=3, num_requests=8), TOK, 512, None)
    assert w.mode == "closed" and w.concurrency == 3
    assert all(r.scheduled_at == 0.0 for r in w.requests)
    assert w.stats["traffic/duration_s"] == 0.0


def test_mooncake_workload_scales_blocks_and_shares_prefixes(tmp_path):
    path = write_jsonl(tmp_path, "mc.jsonl", [
        {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
        {"timestamp": 500, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 1500, "input_length": 512, "output_length": 6, "hash_ids": [9]}])
    cfg = WorkloadConfig(name="mooncake", path=path, num_requests=3, arrival="trace", block_tokens=16,
                         time_scale=2.0, prompt_source="builtin")
    w = build_workload(cfg, TOK, max_model_len=1024, data_root=None)
    ids = [r.prompt_token_ids for r in w.requests]
    assert [len(x) for x in ids] == [32, 47, 16]  # 1024, 1500, 512 tokens in blocks of 16, not 512
    assert ids[0] == ids[1][:32] and ids[2][:16] != ids[0][:16]
    assert [r.prefix_group for r in w.requests] == ["hash-1", "hash-1", None]
    assert [r.scheduled_at for r in w.requests] == [0.0, 1.0, 3.0]
    assert [r.output_len for r in w.requests] == [4, 5, 6]


def test_jsonl_workload_with_text_and_reordered_rows(tmp_path):
    path = write_jsonl(tmp_path, "log.jsonl", [
        {"timestamp": 2.0, "prompt": "second prompt", "output_tokens": 3},
        {"timestamp": 1.0, "prompt": "first", "output_tokens": 2},
        {"timestamp": 4.0, "input_tokens": 30, "output_tokens": 1}])
    w = build_workload(WorkloadConfig(name="jsonl", path=path, arrival="trace", num_requests=10),
                       TOK, 512, None)
    assert [TOK.decode(r.prompt_token_ids) for r in w.requests[:2]] == ["first", "second prompt"]
    assert [r.scheduled_at for r in w.requests] == [0.0, 1.0, 3.0]
    assert w.stats["traffic/reordered_rows"] == 1 and any("out of time order" in m for m in w.warnings)
    assert any("asked for 10" in m for m in w.warnings)


@pytest.mark.parametrize("sampling", ["stratified", "window", "head"])
def test_trace_timing_keeps_the_trace_rate_for_every_sampling(tmp_path, sampling):
    # 200 rows 0.1 s apart: 10 scattered rows of a stratified sample would be ~2 s apart, the trace's
    # rate is 10 req/s, and a replay of it must keep that
    path = write_jsonl(tmp_path, "t.jsonl", [{"timestamp": i / 10, "input_tokens": 5 + i % 17,
                                              "output_tokens": 1 + i % 5} for i in range(200)])
    cfg = WorkloadConfig(name="jsonl", path=path, num_requests=10, sampling=sampling, arrival="trace",
                         time_scale=0.5)
    w = build_workload(cfg, TOK, 512, None)
    assert np.allclose(np.diff([r.scheduled_at for r in w.requests]), 0.05)
    if sampling == "head":
        assert [r.input_len for r in w.requests] == [5 + i for i in range(10)]


def test_untimed_jsonl_cannot_replay_trace_timing(tmp_path):
    path = write_jsonl(tmp_path, "log.jsonl", [{"input_tokens": 5, "output_tokens": 2}] * 3)
    with pytest.raises(ValueError, match="no timestamps.*poisson, gamma or closed"):
        build_workload(WorkloadConfig(name="jsonl", path=path, arrival="trace"), TOK, 512, None)


@pytest.mark.parametrize("field, value, expect", [
    ("name", "azure", "workload.name='azure'.*builtin, azure_conv, mooncake, jsonl, sharegpt"),
    ("sampling", "random", "workload.sampling='random'.*stratified, window, head"),
    ("arrival", "uniform", "workload.arrival='uniform'.*poisson, gamma, trace, closed"),
    ("on_bad_row", "warn", "workload.on_bad_row='warn'.*error, skip"),
    ("length_policy", "cut", "workload.length_policy='cut'.*clip, scale"),
    ("prompt_source", "web", "workload.prompt_source='web'.*auto, sharegpt, builtin"),
    ("num_requests", 0, "workload.num_requests must be an integer >= 1, got 0"),
    ("concurrency", 0, "workload.concurrency must be an integer >= 1, got 0"),
    ("block_tokens", 0, "workload.block_tokens must be"),
    ("rate", 0.0, "workload.rate must be a number > 0, got 0.0"),
    ("cv", -1.0, "workload.cv must be"),
    ("time_scale", 0, "workload.time_scale must be"),
    ("input_len_range", [10, 5], r"workload.input_len_range must be \[low, high\].*\[10, 5\]"),
    ("output_len_range", [0, 5], "workload.output_len_range must be"),
    ("arrival", "trace", "arrival=trace needs a timed trace.*'builtin'"),
])
def test_config_errors_name_field_value_and_valid_values(field, value, expect):
    with pytest.raises(ValueError, match=expect):
        WorkloadConfig(**{field: value})


def test_trace_workloads_need_a_path_or_data():
    with pytest.raises(ValueError, match="workload.path"):
        WorkloadConfig(name="mooncake")
    with pytest.raises(FileNotFoundError, match="data.root"):
        build_workload(WorkloadConfig(name="azure_conv"), TOK, 512, data_root="/nonexistent-root")


def test_azure_conv_500_keeps_the_distribution_and_lengths():
    root = data_root(AZURE_FILE)
    if root is None:
        pytest.skip("the data root has no Azure trace")
    cfg = WorkloadConfig(name="azure_conv", num_requests=500, arrival="trace")
    w = build_workload(cfg, TOK, max_model_len=16384, data_root=str(root))
    assert len(w.requests) == 500 and w.stats["traffic/changed_lengths"] == 0
    rows = load_trace("azure", AZURE_FILE, data_root=str(root)).rows
    sampled = [rows[i] for i in stratified_sample(rows, 500, cfg.seed)]
    assert [(r.input_len, r.output_len) for r in w.requests] == [
        (s.input_len, s.output_len) for s in sampled]
    assert w.stats["traffic/ks_input_len"] <= 0.05 and w.stats["traffic/ks_output_len"] <= 0.05
    assert "sharegpt" in w.source  # prompt text from the data root when it has it
    # a contiguous window's gaps: the trace's own rate (5.5 req/s overall), not 500 scattered rows'
    assert 2.0 < w.stats["traffic/mean_rate_req_s"] < 12.0
    small = build_workload(cfg, TOK, max_model_len=1024, data_root=str(root))
    assert all(r.input_len + r.output_len <= 1024 for r in small.requests)
    assert small.stats["traffic/changed_lengths"] > 0
    assert [r.output_len for r in small.requests] == [min(r.output_len, 1023) for r in w.requests]


def test_one_arrival_is_at_zero_and_counts_are_exact():
    assert poisson_arrivals(1, 2.0, seed=0) == [0.0] and gamma_arrivals(1, 2.0, 1.5, seed=0) == [0.0]
    assert len(poisson_arrivals(7, 2.0, seed=0)) == 7 and len(gamma_arrivals(7, 2.0, 1.5, seed=0)) == 7
    with pytest.raises(ValueError, match=re.escape("number of arrivals n must be an integer >= 1, got 2.5")):
        poisson_arrivals(2.5, 1.0, 0)


def test_gamma_arrivals_are_seeded_and_keep_the_mean_gap_at_any_cv():
    a = gamma_arrivals(50, 4.0, 0.5, seed=7)
    assert a == gamma_arrivals(50, 4.0, 0.5, seed=7) and a != gamma_arrivals(50, 4.0, 0.5, seed=8)
    for cv in (0.5, 3.0):
        gaps = np.diff(gamma_arrivals(40000, 4.0, cv, seed=3))
        assert gaps.mean() == pytest.approx(0.25, rel=0.05)


def test_builtin_lengths_are_log_normal_between_their_bounds():
    """Median at the geometric middle of the bounds, which lie about two standard deviations out."""
    from optladder.traffic.workload import _log_normal

    lengths = np.array(_log_normal([32, 512], 20000, seed=0))
    assert lengths.min() == 32 and lengths.max() == 512
    assert np.median(lengths) == pytest.approx(128, rel=0.03)  # sqrt(32 * 512)
    assert np.mean(lengths == 32) == pytest.approx(0.023, abs=0.006)  # beyond -2 sigma, clipped to the bound
    assert np.mean(lengths == 512) == pytest.approx(0.023, abs=0.006)
    assert np.mean((lengths > 64) & (lengths < 256)) == pytest.approx(0.683, abs=0.02)  # within one sigma


def test_prompts_come_from_sharegpt_only_where_the_data_root_has_it(tmp_path):
    from optladder.traffic.materialize import SHAREGPT_PATH, _has_sharegpt

    assert not _has_sharegpt(str(tmp_path))
    (tmp_path / SHAREGPT_PATH).parent.mkdir(parents=True)
    (tmp_path / SHAREGPT_PATH).write_text("[]")
    assert _has_sharegpt(str(tmp_path))


# --- exact compositions: each workload is its seeded parts, put together as the module docstring says ---
def _sharegpt_root(tmp_path, prompts):
    from optladder.traffic.materialize import SHAREGPT_PATH

    f = tmp_path / SHAREGPT_PATH
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps([{"id": str(i), "conversations": [{"from": "human", "value": p},
                                                               {"from": "gpt", "value": "ok"}]}
                             for i, p in enumerate(prompts)]))
    return str(tmp_path)


def test_builtin_workload_is_exactly_its_seeded_parts(tmp_path):
    from optladder.traffic.materialize import BUILTIN_TEXT
    from optladder.traffic.workload import _log_normal

    root = _sharegpt_root(tmp_path, ["a sharegpt prompt", "another one"])  # auto must still pick builtin
    w = build_workload(WorkloadConfig(num_requests=12, seed=3), TOK, max_model_len=10000, data_root=root)
    ins, outs = _log_normal([32, 384], 12, 3), _log_normal([8, 96], 12, 4)
    assert [r.input_len for r in w.requests] == ins and [r.output_len for r in w.requests] == outs
    sched = poisson_arrivals(12, 2.0, 7)
    assert [r.scheduled_at for r in w.requests] == sched
    rows = [TraceRow(0.0, i, o) for i, o in zip(ins, outs)]
    assert [r.prompt_token_ids for r in w.requests] == materialize(rows, builtin_pool(), TOK, seed=5)
    assert all(r.prompt == TOK.decode(r.prompt_token_ids) and r.ignore_eos for r in w.requests)
    assert w.stats == {"traffic/skipped_rows": 0.0, "traffic/reordered_rows": 0.0, "traffic/num_requests": 12.0,
                       "traffic/changed_lengths": 0.0, "traffic/changed_input_share": 0.0,
                       "traffic/changed_output_share": 0.0, "traffic/duration_s": sched[-1] - sched[0],
                       "traffic/mean_rate_req_s": mean_rate(sched)}
    assert w.warnings == [] and (w.mode, w.concurrency) == ("open", 4)
    assert w.source == f"builtin; prompts: 12 of 12 cut from {BUILTIN_TEXT}"


def test_gamma_and_closed_workloads_use_their_settings():
    w = build_workload(WorkloadConfig(num_requests=6, arrival="gamma", rate=3.0, cv=2.5, seed=1), TOK, 10000)
    assert [r.scheduled_at for r in w.requests] == gamma_arrivals(6, 3.0, 2.5, 5)
    c = build_workload(WorkloadConfig(num_requests=6, arrival="closed", concurrency=2), TOK, 10000)
    assert (c.mode, c.concurrency) == ("closed", 2)
    assert c.stats["traffic/duration_s"] == 0.0 and c.stats["traffic/mean_rate_req_s"] == 0.0


def test_sharegpt_workload_keeps_its_prompts_and_draws_outputs(tmp_path):
    from optladder.traffic.materialize import SHAREGPT_PATH
    from optladder.traffic.workload import _log_normal

    prompts = ["first prompt here", "second", "a third, longer prompt"]
    root = _sharegpt_root(tmp_path, prompts)
    w = build_workload(WorkloadConfig(name="sharegpt", num_requests=3, sampling="head", seed=2), TOK, 10000, root)
    assert [TOK.decode(r.prompt_token_ids) for r in w.requests] == prompts
    assert [r.output_len for r in w.requests] == _log_normal([8, 96], 3, 5)
    assert w.stats["traffic/ks_input_len"] == 0.0 and w.stats["traffic/ks_output_len"] == 0.0
    path = str(tmp_path / SHAREGPT_PATH)
    assert w.source == f"sharegpt:{path}; prompts: 3 of 3 from the trace's own prompt text"


def test_trace_workload_cuts_prompts_from_the_data_roots_sharegpt(tmp_path):
    from optladder.traffic.materialize import SHAREGPT_PATH

    root = _sharegpt_root(tmp_path, ["pool text one", "pool text two"])
    path = write_jsonl(tmp_path, "t.jsonl", [{"input_tokens": 4, "output_tokens": 1}] * 3)
    w = build_workload(WorkloadConfig(name="jsonl", path=path, num_requests=3), TOK, 512, root)
    assert w.source == f"jsonl:{path}; prompts: 3 of 3 cut from {tmp_path / SHAREGPT_PATH}"


def test_skipped_rows_are_counted_and_reported(tmp_path):
    path = write_jsonl(tmp_path, "t.jsonl", [{"timestamp": 0, "input_tokens": 5, "output_tokens": 2},
                                             {"timestamp": 1, "input_tokens": -1, "output_tokens": 2},
                                             {"timestamp": 2, "input_tokens": 6, "output_tokens": 3}])
    w = build_workload(WorkloadConfig(name="jsonl", path=path, num_requests=2, on_bad_row="skip"), TOK, 512)
    assert w.stats["traffic/skipped_rows"] == 1.0 and w.stats["traffic/reordered_rows"] == 0.0
    assert w.warnings == [f"{path}: skipped 1 bad rows (on_bad_row=skip)"]


def _irregular_trace(tmp_path, n=60):
    return write_jsonl(tmp_path, "t.jsonl", [{"timestamp": i * i / 100, "input_tokens": 5 + i,
                                              "output_tokens": 1 + i % 7} for i in range(n)])


def test_window_sampling_and_its_trace_schedule_are_seeded(tmp_path):
    from optladder.traffic.sampling import ks_distance, window_sample

    path = _irregular_trace(tmp_path)
    full = load_trace("jsonl", path).rows
    for sampling, seed in (("window", 4), ("stratified", 9)):
        w = build_workload(WorkloadConfig(name="jsonl", path=path, num_requests=8, sampling=sampling,
                                          arrival="trace", seed=seed), TOK, 512)
        win = window_sample(full, 8, seed)
        assert win[0] > 0
        assert [r.scheduled_at for r in w.requests] == trace_arrivals([full[i].timestamp_s for i in win])
        idx = win if sampling == "window" else stratified_sample(full, 8, seed)
        assert [r.input_len for r in w.requests] == [full[i].input_len for i in idx]
        assert w.stats["traffic/ks_input_len"] == ks_distance([full[i].input_len for i in idx],
                                                              [r.input_len for r in full])
    head = build_workload(WorkloadConfig(name="jsonl", path=path, num_requests=8, sampling="head",
                                         arrival="trace", time_scale=3.0), TOK, 512)
    assert [r.scheduled_at for r in head.requests] == trace_arrivals([i * i / 100 for i in range(8)], 3.0)


def test_lengths_are_fitted_with_the_configured_policy(tmp_path):
    path = write_jsonl(tmp_path, "t.jsonl", [{"input_tokens": 90, "output_tokens": 30}] * 2)
    w = build_workload(WorkloadConfig(name="jsonl", path=path, num_requests=2, length_policy="scale"), TOK, 60)
    assert [(r.input_len, r.output_len) for r in w.requests] == [(45, 15), (45, 15)]
    assert w.warnings == ["2 of 2 requests (100%) exceed engine.max_model_len=60 and were scaled down "
                          "(workload.length_policy=scale); engine.max_model_len=120 fits them all. Most "
                          "requests changed: this replay does not have the trace's lengths",
                          "the length policy changed 100% of the input lengths and 100% of the output lengths "
                          "(more than 5%): the replay does not have the trace's lengths; KS distance to the trace "
                          "of the lengths as replayed 1.000 (input) / 1.000 (output), of the sample before "
                          "fitting 0.000 / 0.000"]


@pytest.mark.parametrize("rows, changed, policy, block_tokens, expect", [
    ([TraceRow(0, 1000, 10, hash_ids=[1, 2]), TraceRow(0, 100, 10, hash_ids=[3]), TraceRow(0, 50, 5),
      TraceRow(0, 10, 512, hash_ids=[4])], 3, "clip", 512,
     "3 of 4 requests (75%) exceed engine.max_model_len=512 and were clipped (workload.length_policy=clip); "
     "engine.max_model_len=1010 fits them all, or workload.block_tokens=257 (prompt blocks of 257 tokens "
     "instead of 512), which fits 2 of the 3 hash-block requests (1 fit at no block_tokens). Most requests "
     "changed: this replay does not have the trace's lengths"),
    # one row fits at no block_tokens (its output leaves 1 token for 2000 of prompt): the others still get theirs
    ([TraceRow(0, 1000, 12, hash_ids=[1, 2]), TraceRow(0, 2000, 511, hash_ids=[3]), TraceRow(0, 600, 12, hash_ids=[5]),
      TraceRow(0, 10, 10)], 3, "clip", 512,
     "3 of 4 requests (75%) exceed engine.max_model_len=512 and were clipped (workload.length_policy=clip); "
     "engine.max_model_len=2511 fits them all, or workload.block_tokens=256 (prompt blocks of 256 tokens "
     "instead of 512), which fits 2 of the 3 hash-block requests (1 fit at no block_tokens). Most requests "
     "changed: this replay does not have the trace's lengths"),
    ([TraceRow(0, 100, 10, hash_ids=[3]), TraceRow(0, 2000, 5)], 1, "clip", 512,  # unhashed rows do not shrink
     "1 of 2 requests (50%) exceed engine.max_model_len=512 and were clipped (workload.length_policy=clip); "
     "engine.max_model_len=2005 fits them all"),
    ([TraceRow(0, 1, 511, hash_ids=[1])], 1, "scale", 16,
     "1 of 1 requests (100%) exceed engine.max_model_len=512 and were scaled down (workload.length_policy=scale); "
     "engine.max_model_len=512 fits them all. Most requests changed: this replay does not have the trace's lengths"),
    ([TraceRow(0, 16, 511, hash_ids=[1]), TraceRow(0, 1, 1)], 1, "clip", 16,  # fit exactly 1
     "1 of 2 requests (50%) exceed engine.max_model_len=512 and were clipped (workload.length_policy=clip); "
     "engine.max_model_len=527 fits them all, or workload.block_tokens=1 (prompt blocks of 1 tokens instead of 512)"),
    ([TraceRow(0, 16, 496, hash_ids=[1]), TraceRow(0, 1, 1), TraceRow(0, 1, 1)], 1, "clip", 16,  # fit == block
     "1 of 3 requests (33%) exceed engine.max_model_len=512 and were clipped (workload.length_policy=clip); "
     "engine.max_model_len=512 fits them all"),
])
def test_fit_warning_says_what_changed_and_what_would_fit(rows, changed, policy, block_tokens, expect):
    from optladder.traffic.workload import _fit_warning

    cfg = WorkloadConfig(name="mooncake", path="x", length_policy=policy, block_tokens=block_tokens)
    assert _fit_warning(rows, changed, 512, cfg) == expect


def test_scale_blocks_rescales_only_hash_rows():
    from optladder.traffic.workload import _scale_blocks

    plain = [TraceRow(1.5, 100, 3, prompt_text="p", output_text="o")]
    warnings = []
    assert _scale_blocks(plain, 16, warnings) is plain and warnings == []
    rows = plain + [TraceRow(2.5, 1024, 4, hash_ids=[1, 2], prompt_text="q", output_text="r"),
                    TraceRow(3.5, 10, 5, hash_ids=[3])]
    assert _scale_blocks(rows, 512, warnings) is rows and warnings == []
    assert _scale_blocks(rows, 16, warnings) == [
        TraceRow(1.5, 100, 3, prompt_text="p", output_text="o"),
        TraceRow(2.5, 32, 4, hash_ids=[1, 2], prompt_text="q", output_text="r"),
        TraceRow(3.5, 1, 5, hash_ids=[3])]  # 10 * 16/512 rounds to 0: raised to 1
    assert warnings == ["hash-block rows: input lengths scaled by block_tokens/512 = 16/512"]


@pytest.mark.parametrize("field, value, expect", [
    ("num_requests", True, "workload.num_requests must be an integer >= 1, got True"),
    ("rate", float("inf"), "workload.rate must be a number > 0, got inf"),
    ("input_len_range", [1, 2, 3], "workload.input_len_range must be [low, high] integers with 1 <= low <= high, "
                                   "got [1, 2, 3]"),
    ("arrival", "trace", "workload.arrival=trace needs a timed trace, and workload.name='builtin' has none; use "
                         "it with azure_conv, mooncake, jsonl, or set arrival to poisson, gamma or closed"),
    ("name", "jsonl", "workload.name=jsonl needs workload.path=<file> (absolute, or under the data root)"),
])
def test_config_error_messages_are_whole(field, value, expect):
    with pytest.raises(ValueError) as e:
        WorkloadConfig(**{field: value})
    assert str(e.value) == expect


def test_config_boundaries_are_accepted():
    cfg = WorkloadConfig(num_requests=1, concurrency=1, block_tokens=1, input_len_range=[1, 1],
                         output_len_range=[1, 1])
    assert (cfg.num_requests, cfg.block_tokens, cfg.input_len_range) == (1, 1, [1, 1])


def test_trace_arrivals_edges_and_messages():
    assert trace_arrivals([1.0, 3.0]) == [0.0, 2.0]  # time_scale defaults to 1
    assert trace_arrivals([5.0]) == [0.0] and trace_arrivals([1.0, 1.0, 2.0]) == [0.0, 0.0, 1.0]
    out = trace_arrivals([1, 3], 2)
    assert out == [0.0, 4.0] and all(type(t) is float for t in out)
    for bad, msg in (([], "trace_arrivals needs at least one timestamp"),
                     ([2.0, 1.0], "trace_arrivals needs timestamps in time order (load_trace sorts them)")):
        with pytest.raises(ValueError) as e:
            trace_arrivals(bad)
        assert str(e.value) == msg


def test_mean_rate_is_n_minus_one_over_duration():
    assert mean_rate([2.0, 3.0, 6.0]) == 0.5 and mean_rate([0.0, 2.0]) == 0.5 and mean_rate([0.0, 0.5]) == 2.0
    assert mean_rate([0.0]) == 0.0 and mean_rate([1.0, 1.0]) == 0.0


# --- materialization, exactly ---
class BosTokenizer(CharTokenizer):
    """Adds a BOS id (1) unless told not to, as HF tokenizers do: prompts must never carry it."""

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


def test_pool_windows_wrap_and_pools_carry_no_special_tokens():
    from optladder.traffic.materialize import TokenPool

    assert TokenPool(np.array([10, 11, 12, 13]), "s").window(3, 3) == [13, 10, 11]
    pool = build_pool(["ab", "c"], BosTokenizer(), "src")
    assert pool.ids.tolist() == [97, 98, 10, 10, 99, 10, 10] and pool.source == "src"
    with pytest.raises(ValueError) as e:
        build_pool([], TOK, "src")
    assert str(e.value) == "prompt text from src gives no tokens; check the file, or set workload.prompt_source=builtin"


def test_materialized_sources_and_starts_are_exact():
    from optladder.traffic.materialize import TokenPool, materialize_with_sources

    pool = TokenPool(np.arange(100, 140), "s")
    rows = [TraceRow(0, 3, 1, prompt_text="abcdef"), TraceRow(0, 3, 1, prompt_text="abc"),
            TraceRow(0, 4, 1, prompt_text="a"), TraceRow(0, 3, 1, prompt_text=""),
            TraceRow(0, 8, 1, hash_ids=[1, 2, 3]), TraceRow(0, 5, 1), TraceRow(0, 2, 1)]
    prompts, sources = materialize_with_sources(rows, pool, BosTokenizer(), seed=4, block_tokens=8)
    assert sources == ["own", "own", "own+pool", "pool", "pool", "pool", "pool"]
    starts = np.random.default_rng(4).choice(40, size=8, replace=False).tolist()  # 1 hash block + 7 rows
    assert prompts == [[97, 98, 99], [97, 98, 99], [97] + pool.window(starts[3], 3), pool.window(starts[4], 3),
                       pool.window(starts[0], 8), pool.window(starts[6], 5), pool.window(starts[7], 2)]
    with pytest.raises(ValueError) as e:
        materialize_with_sources(rows, pool, TOK, 0, block_tokens=0)
    assert str(e.value) == "block_tokens must be >= 1, got 0"
    assert len(materialize_with_sources(rows, pool, TOK, 0, block_tokens=1)[0]) == 7


def test_starts_are_distinct_while_the_pool_allows_and_blocks_default_to_512():
    from optladder.traffic.materialize import TokenPool, materialize_with_sources

    pool = TokenPool(np.arange(3), "s")
    firsts = [p[0] for p in materialize([TraceRow(0, 1, 1)] * 3, pool, TOK, seed=0)]
    assert firsts == np.random.default_rng(0).choice(3, size=3, replace=False).tolist()
    big = builtin_pool()
    rows = [TraceRow(0, 600, 1, hash_ids=[1, 2]), TraceRow(0, 600, 1, hash_ids=[1, 3])]
    assert materialize(rows, big, TOK, 0) == materialize(rows, big, TOK, 0, block_tokens=512)
    assert materialize_with_sources(rows, big, TOK, 0)[0] == materialize(rows, big, TOK, 0, block_tokens=512)


def test_sources_label_counts_each_kind():
    from optladder.traffic.materialize import sources_label

    assert sources_label(["own", "own+pool", "pool", "pool"], "P") == (
        "1 of 4 from the trace's own prompt text; 1 of 4 from their own text topped up from P; 2 of 4 cut from P")
    assert sources_label(["pool"], "P") == "1 of 1 cut from P"
    assert sources_label(["own", "own"], "P") == "2 of 2 from the trace's own prompt text"
    assert sources_label(["own+pool"], "P") == "1 of 1 from their own text topped up from P"


def test_prompt_texts_pick_their_source(tmp_path, monkeypatch):
    from optladder.traffic.materialize import BUILTIN_TEXT, SHAREGPT_PATH

    monkeypatch.delenv("OPTLADDER_DATA", raising=False)
    with pytest.raises(ValueError) as e:
        prompt_texts("web", None, TOK)
    assert str(e.value) == "prompt_source 'web' is not one of auto, sharegpt, builtin"
    texts, source = prompt_texts("auto", str(tmp_path), TOK)  # no ShareGPT there: the builtin text
    assert source == str(BUILTIN_TEXT) and len(texts) > 2
    assert all(t == t.strip() and "\n\n" not in t and " " in t for t in texts)
    f = tmp_path / SHAREGPT_PATH
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hello there"}]}, {"bad": 1},
                             {"conversations": [{"from": "human", "value": "   "}]},
                             {"conversations": [{"from": "human", "value": "second"}]}]))
    for how in ("auto", "sharegpt"):
        assert prompt_texts(how, str(tmp_path), TOK) == (["hello there", "second"], str(f))


# --- the lengths as replayed, beside the trace's ---
def _clipped_azure(tmp_path, n=200, long_every=5):
    """An Azure-format trace where 1 row in long_every has a prompt longer than 600 tokens."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        n_in = 700 + 7 * i if i % long_every == 0 else 20 + (i * 37) % 400
        lines.append(f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.0000000,{n_in},{1 + (i * 13) % 50}")
    p = tmp_path / "clipped_azure.csv"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_ks_is_of_the_lengths_as_replayed_and_the_trace_figure_is_beside_it(tmp_path):
    from optladder.traffic.sampling import ks_distance

    path = _clipped_azure(tmp_path)
    full = load_trace("azure", path).rows
    cfg = WorkloadConfig(name="azure_conv", path=path, num_requests=50, prompt_source="builtin")
    w = build_workload(cfg, TOK, max_model_len=600, data_root=None)
    sample = [full[i] for i in stratified_sample(full, 50, cfg.seed)]
    sent_in = [r.input_len for r in w.requests]
    long_share = sum(r.input_len + r.output_len > 600 for r in sample) / 50
    assert 0.1 < long_share < 0.4  # the clipped fifth of the trace is in the sample too
    assert w.stats["traffic/ks_input_len_trace"] == ks_distance([r.input_len for r in sample],
                                                                [r.input_len for r in full])
    assert w.stats["traffic/ks_input_len"] == ks_distance(sent_in, [r.input_len for r in full])
    # the sample represents the trace; what was replayed lost its long prompts, and the KS shows it
    assert w.stats["traffic/ks_input_len_trace"] < 0.1 < w.stats["traffic/ks_input_len"] - 0.05
    assert w.stats["traffic/ks_input_len"] == pytest.approx(long_share, abs=0.05)
    assert w.stats["traffic/changed_input_share"] == long_share
    assert w.stats["traffic/changed_output_share"] == 0.0  # clip shortens the input first
    assert w.stats["traffic/ks_output_len"] == w.stats["traffic/ks_output_len_trace"]
    msg = next(m for m in w.warnings if m.startswith("the length policy changed"))
    assert f"{long_share:.0%} of the input lengths" in msg and f"{w.stats['traffic/ks_input_len']:.3f} (input)" in msg


def test_a_replay_that_keeps_the_lengths_has_both_ks_equal_and_no_flag(tmp_path):
    from optladder.traffic.workload import departures

    path = _clipped_azure(tmp_path)
    w = build_workload(WorkloadConfig(name="azure_conv", path=path, num_requests=50, prompt_source="builtin"),
                       TOK, max_model_len=4096, data_root=None)
    assert w.stats["traffic/ks_input_len"] == w.stats["traffic/ks_input_len_trace"]
    assert w.stats["traffic/changed_input_share"] == 0.0 and departures(w.stats) == {}


@pytest.mark.parametrize("share_in, share_out, flagged", [(0.05, 0.0, False), (0.06, 0.0, True),
                                                          (0.0, 0.2, True), (0.0, 0.0, False)])
def test_the_lengths_changed_flag_is_above_the_threshold(share_in, share_out, flagged):
    from optladder.traffic.sampling import LENGTHS_CHANGED_WARN
    from optladder.traffic.workload import departures

    assert LENGTHS_CHANGED_WARN == 0.05
    notes = departures({"traffic/changed_input_share": share_in, "traffic/changed_output_share": share_out})
    assert ("optladder.lengths_changed" in notes) is flagged


def test_changed_shares_count_each_length_on_its_own():
    from optladder.traffic.sampling import changed_shares

    before = [TraceRow(0, 10, 5), TraceRow(0, 10, 5), TraceRow(0, 10, 5), TraceRow(0, 10, 5)]
    after = [TraceRow(0, 9, 5), TraceRow(0, 10, 4), TraceRow(0, 8, 3), TraceRow(0, 10, 5)]
    assert changed_shares(before, after) == (0.5, 0.5)
    with pytest.raises(ValueError, match="got 4 and 3 rows"):
        changed_shares(before, after[:3])


# --- prefix reuse as the trace has it, and as replayed ---
def test_prefix_hit_rate_counts_chained_blocks_before_the_last_token():
    from optladder.traffic.materialize import prefix_hit_rate

    rows = [TraceRow(0, 2048, 10, hash_ids=[1, 2, 3, 4]),  # queries (2048 - 1) // 512 = 3 blocks: all miss
            TraceRow(0, 2048, 10, hash_ids=[1, 2, 3, 5]),  # 3 queried, [1], [1,2], [1,2,3] cached: 3 hits
            TraceRow(0, 1536, 10, hash_ids=[1, 2, 6]),  # 2 queried, 2 hits
            TraceRow(0, 1024, 10, hash_ids=[7, 8]),  # 1 queried, a miss
            TraceRow(0, 1024, 10, hash_ids=[9, 2]),  # 2 after 9 is not 2 after 1: 1 queried, a miss
            TraceRow(0, 1025, 10, hash_ids=[7, 8, 1])]  # 2 queried: [7] and [7,8] were full blocks: 2 hits
    assert prefix_hit_rate(rows, 512) == 7 / 12
    # the last prompt token's block is never queried: 512 tokens query nothing, 513 one block
    assert prefix_hit_rate([TraceRow(0, 512, 1, hash_ids=[1]), TraceRow(0, 512, 1, hash_ids=[1])], 512) is None
    assert prefix_hit_rate([TraceRow(0, 513, 1, hash_ids=[1, 2]), TraceRow(0, 513, 1, hash_ids=[1, 2])], 512) == 0.5
    # a partial block is not registered: the second row cannot reuse the first's 300 tokens
    assert prefix_hit_rate([TraceRow(0, 300, 1, hash_ids=[1]), TraceRow(0, 1024, 1, hash_ids=[1, 2])], 512) == 0.0
    # blocks beyond the hash ids are the row's own; rows with their own text have none to share
    assert prefix_hit_rate([TraceRow(0, 2048, 1, hash_ids=[1]), TraceRow(0, 2048, 1, hash_ids=[1])], 512) == 1 / 6
    assert prefix_hit_rate([TraceRow(0, 2048, 1, hash_ids=[1], prompt_text="x")] * 2, 512) is None
    assert prefix_hit_rate([TraceRow(0, 64, 1, hash_ids=[1, 2, 3])] * 2, 16) == 3 / 6
    with pytest.raises(ValueError, match="block_tokens must be >= 1, got 0"):
        prefix_hit_rate(rows, 0)


def _system_prompt_trace(tmp_path, n=5):
    """n Mooncake rows of 8 blocks: one shared first block (a system prompt), then each its own."""
    return write_jsonl(tmp_path, "mc.jsonl", [
        {"timestamp": 100 * i, "input_length": 4096, "output_length": 10,
         "hash_ids": [1] + [100 * (i + 1) + j for j in range(7)]} for i in range(n)])


def test_clipping_changes_the_prefix_reuse_and_the_workload_says_so(tmp_path):
    from optladder.traffic.workload import departures

    cfg = WorkloadConfig(name="mooncake", path=_system_prompt_trace(tmp_path), num_requests=5, prompt_source="builtin")
    whole = build_workload(cfg, TOK, max_model_len=5000, data_root=None)
    # each row queries 7 blocks; the 4 after the first reuse the shared one: 4 / 35, kept when nothing is clipped
    assert whole.stats["traffic/prefix_hit_rate_trace"] == whole.stats["traffic/prefix_hit_rate_replayed"] == 4 / 35
    assert "optladder.prefix_reuse_changed" not in departures(whole.stats)
    clipped = build_workload(cfg, TOK, max_model_len=1034, data_root=None)  # 1024 prompt tokens: 2 blocks, 1 queried
    assert clipped.stats["traffic/prefix_hit_rate_trace"] == 4 / 35
    assert clipped.stats["traffic/prefix_hit_rate_replayed"] == 4 / 5
    note = departures(clipped.stats)["optladder.prefix_reuse_changed"]
    assert "from 11.4% to 80.0%" in note and note in clipped.warnings


def test_the_replayed_rate_is_what_the_engines_block_manager_counts(tmp_path):
    """Prompts as materialized, through the reference engine's block manager one after another with a pool
    that evicts nothing: the hits it counts are the rate the workload logged."""
    from optladder.engine.block_manager import BlockManager
    from optladder.engine.sequence import SamplingParams, Sequence

    rows = [{"timestamp": 10 * i, "input_length": 512 * (1 + i % 4) + 37 * i, "output_length": 3,
             "hash_ids": [1, 2, 3 + i % 3, 10 + i % 2, 20 + i]} for i in range(12)]
    cfg = WorkloadConfig(name="mooncake", path=write_jsonl(tmp_path, "mc.jsonl", rows), num_requests=12,
                         block_tokens=16, prompt_source="builtin")
    w = build_workload(cfg, TOK, max_model_len=50, data_root=None)
    bm = BlockManager(num_blocks=4096, block_size=16, enable_prefix_cache=True)
    for r in w.requests:
        s = Sequence(r.id, r.prompt_token_ids, SamplingParams(max_tokens=1))
        bm.allocate(s)
        bm.register_full_blocks(s, len(s))
        bm.deallocate(s)
    assert 0 < bm.prefix_hits < bm.prefix_queries
    assert w.stats["traffic/prefix_hit_rate_replayed"] == bm.prefix_hits / bm.prefix_queries
    assert w.stats["traffic/changed_input_share"] > 0.4  # many were clipped: their last blocks are not queried
