"""Stratified and window samples, KS distance, fitting lengths to a context; the real Azure trace."""

import numpy as np
import pytest

from tests.conftest import data_root
from optladder.traffic.sampling import fit_lengths, ks_distance, stratified_sample, window_sample
from optladder.traffic.traces import TraceRow, load_trace

AZURE_FILE = "traces/azure_conv_2023.csv"


def synthetic_rows(n=20000, seed=1):
    """Long-tailed, correlated lengths like chat traffic: longer prompts tend to get longer answers."""
    rng = np.random.default_rng(seed)
    ins = np.exp(rng.normal(6.5, 1.0, n)).astype(int) + 1
    outs = (np.exp(rng.normal(4.5, 0.8, n)) * (ins / ins.mean()) ** 0.3).astype(int) + 1
    return [TraceRow(float(i), int(a), int(b)) for i, (a, b) in enumerate(zip(ins, outs))]


def lengths(rows, idx=None):
    rows = rows if idx is None else [rows[i] for i in idx]
    return [r.input_len for r in rows], [r.output_len for r in rows]


def test_stratified_sample_shape_and_determinism():
    rows = synthetic_rows(5000)
    a = stratified_sample(rows, 300, seed=7)
    assert len(a) == len(set(a)) == 300 and a == sorted(a)
    assert a == stratified_sample(rows, 300, seed=7)
    assert a != stratified_sample(rows, 300, seed=8)
    assert stratified_sample(rows[:10], 50, seed=0) == list(range(10))  # more asked than there are


def test_stratified_keeps_both_marginals_and_the_joint():
    rows = synthetic_rows()
    full_in, full_out = lengths(rows)
    full_corr = np.corrcoef(np.log(full_in), np.log(full_out))[0, 1]
    for seed in range(5):
        s_in, s_out = lengths(rows, stratified_sample(rows, 500, seed))
        assert ks_distance(s_in, full_in) <= 0.05 and ks_distance(s_out, full_out) <= 0.05
        assert abs(np.corrcoef(np.log(s_in), np.log(s_out))[0, 1] - full_corr) < 0.1


def test_stratified_beats_plain_random_sampling():
    rows = synthetic_rows()
    full_in, _ = lengths(rows)
    rng = np.random.default_rng(0)
    strat = [ks_distance(lengths(rows, stratified_sample(rows, 200, s))[0], full_in) for s in range(20)]
    rand = [ks_distance(lengths(rows, rng.choice(len(rows), 200, replace=False))[0], full_in)
            for _ in range(20)]
    assert np.mean(strat) < np.mean(rand)


def test_real_azure_trace_ks_at_500():
    root = data_root(AZURE_FILE)
    if root is None:
        pytest.skip("the data root has no Azure trace")
    rows = load_trace("azure", AZURE_FILE, data_root=str(root)).rows
    full_in, full_out = lengths(rows)
    s_in, s_out = lengths(rows, stratified_sample(rows, 500, seed=0))
    assert ks_distance(s_in, full_in) <= 0.05
    assert ks_distance(s_out, full_out) <= 0.05


def test_window_sample_is_contiguous_and_seeded():
    rows = synthetic_rows(1000)
    w = window_sample(rows, 100, seed=3)
    assert w == list(range(w[0], w[0] + 100)) and 0 <= w[0] <= 900
    assert w == window_sample(rows, 100, seed=3)
    assert window_sample(rows, 5000, seed=3) == list(range(1000))


def test_sample_size_must_be_positive():
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        stratified_sample(synthetic_rows(10), 0, seed=0)
    with pytest.raises(ValueError, match="n must be >= 1"):
        window_sample(synthetic_rows(10), -1, seed=0)


def test_ks_distance():
    from scipy.stats import ks_2samp

    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 50, 300), rng.integers(0, 60, 2000)  # ties, like token counts
    assert ks_distance(a, b) == pytest.approx(ks_2samp(a, b).statistic, abs=1e-12)
    assert ks_distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert ks_distance([1, 2], [10, 20]) == 1.0
    with pytest.raises(ValueError, match="non-empty"):
        ks_distance([], [1])


def test_fit_lengths_clip_shortens_input_first():
    rows = [TraceRow(0, 100, 20), TraceRow(0, 50, 10), TraceRow(0, 10, 500), TraceRow(0, 0, 0)]
    fitted, changed = fit_lengths(rows, 64, "clip")
    assert [(r.input_len, r.output_len) for r in fitted] == [(44, 20), (50, 10), (1, 63), (1, 1)]
    assert changed == 3
    assert rows[0].input_len == 100  # the input rows are not modified


def test_fit_lengths_scale_keeps_the_ratio():
    fitted, changed = fit_lengths([TraceRow(0, 3000, 1000), TraceRow(0, 10000, 1)], 400, "scale")
    assert changed == 2
    assert (fitted[0].input_len, fitted[0].output_len) == (300, 100)
    assert fitted[1].output_len == 1 and fitted[1].input_len + fitted[1].output_len <= 400


@pytest.mark.parametrize("policy", ["clip", "scale"])
def test_fit_lengths_always_fits(policy):
    rng = np.random.default_rng(0)
    rows = [TraceRow(0, int(a), int(b)) for a, b in rng.integers(0, 5000, size=(500, 2))]
    for limit in (2, 3, 100, 4096):
        fitted, _ = fit_lengths(rows, limit, policy)
        assert all(r.input_len >= 1 and r.output_len >= 1 and r.input_len + r.output_len <= limit
                   for r in fitted)


def test_fit_lengths_bad_arguments():
    with pytest.raises(ValueError, match="'crop' is not one of clip, scale"):
        fit_lengths([TraceRow(0, 1, 1)], 10, "crop")
    with pytest.raises(ValueError, match=r"max_model_len must be >= 2 .*got 1"):
        fit_lengths([TraceRow(0, 1, 1)], 1)


def test_every_cell_of_both_lengths_gets_its_exact_share():
    """Input and output lengths independent, four equal cells: stratifying on both gives each cell exactly a
    quarter of the sample for every seed; stratifying on one length would leave the other to chance."""
    rows = [TraceRow(float(i), 100 if i % 2 else 1000, 10 if (i // 2) % 2 else 100) for i in range(1000)]
    for seed in range(5):
        picked = stratified_sample(rows, 100, seed)
        cells = {}
        for i in picked:
            key = (rows[i].input_len, rows[i].output_len)
            cells[key] = cells.get(key, 0) + 1
        assert cells == {(100, 10): 25, (100, 100): 25, (1000, 10): 25, (1000, 100): 25}, seed


def test_window_starts_anywhere_from_the_first_row_to_the_last_that_fits():
    rows = synthetic_rows(12)
    starts = {window_sample(rows, 10, seed=s)[0] for s in range(200)}
    assert starts == {0, 1, 2}
    assert window_sample(rows, 12, seed=0) == list(range(12))


# --- exact small cases: each number follows from the inputs ---
def test_sample_size_and_empty_trace_are_checked():
    rows = [TraceRow(0.0, 1, 1)] * 3
    assert len(stratified_sample(rows, 1, 0)) == 1 and len(window_sample(rows, 1, 0)) == 1
    with pytest.raises(ValueError) as e:
        window_sample([], 1, 0)
    assert str(e.value) == "cannot sample from an empty trace"


def test_quantile_bins_are_exact_and_ties_go_right():
    from optladder.traffic.sampling import _quantile_bins

    assert _quantile_bins(np.arange(1, 9), 4).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert _quantile_bins(np.array([1, 2, 2, 3]), 2).tolist() == [0, 1, 1, 1]  # the median 2 is an edge


def test_largest_remainder_hands_leftovers_to_the_largest_remainders_first():
    from optladder.traffic.sampling import _largest_remainder

    assert _largest_remainder(np.array([5, 3, 2]), 5).tolist() == [3, 1, 1]  # ties: the first cell
    assert _largest_remainder(np.array([2, 9]), 5).tolist() == [1, 4]  # remainder .91 beats .09
    assert _largest_remainder(np.ones(20, dtype=int), 10).tolist() == [1] * 10 + [0] * 10  # ties: the first cells


def test_small_samples_are_one_cell_and_larger_ones_are_stratified_in_cell_order():
    rows = [TraceRow(float(i), 10 + i, 5) for i in range(30)]
    picked = np.random.default_rng(3).choice(np.arange(30), size=4, replace=False)
    assert stratified_sample(rows, 4, 3) == sorted(picked.tolist())  # n < 10: k = 1, a single cell
    # 100 rows, n = 20: k = 2, cells (input half, output half) of sizes 40, 10, 10, 40 get 8, 2, 2, 8
    rows = [TraceRow(float(i), i, 1 + int((i < 50) == (i % 5 != 0))) for i in range(100)]
    cells = [[i for i in range(100) if (i >= 50, rows[i].output_len) == key]
             for key in ((False, 1), (False, 2), (True, 1), (True, 2))]
    assert [len(c) for c in cells] == [10, 40, 40, 10]
    rng = np.random.default_rng(7)
    expect = [j for c, a in zip(cells, (2, 8, 8, 2)) for j in rng.choice(np.array(c), size=a, replace=False)]
    assert stratified_sample(rows, 20, 7) == sorted(expect)


def test_ks_distance_of_single_values_and_its_message():
    assert ks_distance([1.0], [2.0]) == 1.0
    assert ks_distance([1, 2], [1, 2, 3, 4]) == 0.5
    with pytest.raises(ValueError) as e:
        ks_distance([], [1.0])
    assert str(e.value) == "ks_distance needs two non-empty samples"


def test_fit_lengths_boundaries_and_scale_floors():
    rows = [TraceRow(0.0, 60, 40)]
    assert fit_lengths(rows, 100) == (rows, 0)  # exactly max_model_len fits
    assert fit_lengths([TraceRow(0.0, 3, 197)], 100, "scale") == ([TraceRow(0.0, 1, 98)], 1)


def test_ks_distance_is_two_sided():
    """The sample's ECDF lies below the trace's everywhere (its lengths are the trace's longest): the largest
    gap is negative, so a one-sided max(gap) would call the sample perfect."""
    trace = [1, 2, 3, 10, 11, 12]
    sample = [10, 11, 12]  # F_sample(3) = 0, F_trace(3) = 0.5
    assert ks_distance(sample, trace) == 0.5
    assert ks_distance(trace, sample) == 0.5  # and the same the other way round
    assert ks_distance([100, 200], [1, 2, 3, 4]) == 1.0  # disjoint, sample entirely above
    assert ks_distance([1, 2], [1, 2]) == 0.0
