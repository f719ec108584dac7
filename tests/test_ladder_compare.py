"""optladder/experiments/ladder_compare.py on ladders the H200 ran (benchmarks/results/gpu_ladder_h200/): a ladder against
itself reproduces, against one run with other settings it does not, and a moved metric, verdict or setting is named."""
import json
import math
import shutil
from pathlib import Path

import pytest

from optladder.experiments.ladder_compare import chance_outside, load, main, tail
from optladder.experiments.snapshot import SNAPSHOT_FILE

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu_ladder_h200"
SMOLLM2 = RESULTS / "smollm2_ts2_200"
CAPACITY = RESULTS / "smollm2_capacity_64"
REPRO = RESULTS / "smollm2_ts2_200_repro"  # the same ladder again on another machine (not reproduced)
# defaults that changed between the two runs for switches neither ran
CHANGED = ["--ignore", "engine.piecewise_max_tokens", "--ignore", "replay.capacity_requests",
           "--ignore", "replay.capacity_stop_early"]


def _copy(tmp_path: Path, src: Path = SMOLLM2) -> Path:
    """ladder.json and the first rung's snapshot: what the comparison reads."""
    dst = tmp_path / src.name
    (dst / "rung0-baseline-r0").mkdir(parents=True)
    shutil.copy(src / "ladder.json", dst)
    shutil.copy(src / "rung0-baseline-r0" / SNAPSHOT_FILE, dst / "rung0-baseline-r0")
    return dst


def _edit_ladder(path: Path, fn) -> None:
    ladder = json.loads((path / "ladder.json").read_text())
    fn(ladder)
    (path / "ladder.json").write_text(json.dumps(ladder))


def test_a_ladder_reproduces_itself(capsys):
    assert main([str(SMOLLM2), str(SMOLLM2 / "ladder.json")]) == 0
    out = capsys.readouterr().out
    assert "verdicts: 7/7 the same" in out and "\nreproduced" in out


def test_other_settings_and_verdicts_are_not_a_reproduction(capsys):
    assert main([str(SMOLLM2), str(CAPACITY)]) == 1
    out = capsys.readouterr().out
    assert "workload.num_requests: 200 -> 64" in out and "quality.num_prompts: 200 -> 20" in out
    assert "rung 2 (flash_attn): verdict inconclusive in A, pass in B" in out
    assert "rung 6 (cuda_graphs): verdict pass in A, inconclusive in B" in out
    assert "other requests (requests_digest differs)" in out


@pytest.mark.parametrize("factor, reproduced", [(1.1, True), (1.3, False)])
def test_a_metric_outside_the_noise_band_is_named(tmp_path, capsys, factor, reproduced):
    copy = _copy(tmp_path)

    def slower(ladder):
        ladder["rungs"][3]["metrics"]["perf/e2e_ms_p99"] *= factor
    _edit_ladder(copy, slower)
    assert main([str(SMOLLM2), str(copy), "--noise-sd", "0.1", "--k", "2"]) == (0 if reproduced else 1)
    out = capsys.readouterr().out
    assert ("rung 3 (dynamic_batching): E2E p99 (ms)" in out) is not reproduced
    # a wider band takes the same move
    assert main([str(SMOLLM2), str(copy), "--noise-sd", "0.2"]) == 0


def test_a_changed_setting_counts_unless_ignored(tmp_path, capsys):
    copy = _copy(tmp_path)
    snap = copy / "rung0-baseline-r0" / SNAPSHOT_FILE
    data = json.loads(snap.read_text())
    data["resolved_config"]["engine"]["piecewise_max_tokens"] = 256
    data["resolved_config"]["data"]["root"] = "/elsewhere"  # where the data lives is not a setting
    snap.write_text(json.dumps(data))
    assert main([str(SMOLLM2), str(copy)]) == 1
    out = capsys.readouterr().out
    assert "engine.piecewise_max_tokens: 2048 -> 256" in out and "the settings differ (engine.piecewise_max_tokens)" in out
    assert main([str(SMOLLM2), str(copy), "--ignore", "engine.piecewise_max_tokens"]) == 0
    assert "not counted: data.root" in capsys.readouterr().out


def test_what_cannot_be_compared_is_refused(tmp_path, capsys):
    copy = _copy(tmp_path)
    _edit_ladder(copy, lambda ladder: ladder["rungs"].pop())
    assert main([str(SMOLLM2), str(copy)]) == 2
    assert "other rungs" in capsys.readouterr().err
    assert main([str(SMOLLM2), str(tmp_path / "nothing")]) == 2
    assert "no ladder.json there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(SMOLLM2), str(SMOLLM2), "--noise-sd", "0"])
    assert "--noise-sd=0.0: must be a positive number" in capsys.readouterr().err


def test_the_h200_rerun_at_time_scale_2_does_not_reproduce_and_says_which_rungs_were_past_capacity(capsys):
    assert main([str(SMOLLM2), str(REPRO)]) == 1  # the changed defaults count unless ignored
    assert "engine.piecewise_max_tokens: 2048 -> 256" in capsys.readouterr().out
    assert main([str(SMOLLM2), str(REPRO), *CHANGED]) == 1
    out = capsys.readouterr().out
    assert "settings: 0 difference(s) (the same ladder)" in out
    assert "rung 2 (flash_attn): verdict inconclusive in A, pass in B (borderline) [load 1.08 / 1.04]" in out
    assert "rung 3 (dynamic_batching): verdict pass in A, inconclusive in B (borderline) [load 1.00 / 1.02]" in out
    assert "| 6 | cuda_graphs | pass | pass | 0.51 / 0.51 |" in out  # the all-on rung: half loaded, and reproduced
    assert "rung 6 (cuda_graphs):" not in out
    footer = next(line for line in out.splitlines() if "ran at a load of 0.8 or more" in line)
    assert footer.startswith("6 rung(s)") and "rung 5 (batched_decode)" in footer and "cuda_graphs" not in footer


def test_load_is_the_offered_rate_times_the_time_per_decode_row(capsys):
    m = {"traffic/duration_s": 100.0, "perf/makespan_s": 125.0, "perf/throughput_out_tok_s": 320.0,
         "stage/decode_ms_mean": 30.0, "perf/step_decode_tokens_mean": 10.0}
    # offered: 320 tok/s served over 125 s = 40,000 tokens in a 100 s trace = 400 tok/s; 3 ms a row
    assert load(m) == pytest.approx(1.2)
    assert load({**m, "traffic/duration_s": 0.0}) is None  # a closed loop has no arrival span
    assert load({k: v for k, v in m.items() if k != "stage/decode_ms_mean"}) is None  # no stage timers (vLLM)
    # a ladder that reproduces prints no capacity note, though its eager rungs ran near capacity
    assert main([str(SMOLLM2), str(SMOLLM2)]) == 0
    out = capsys.readouterr().out
    assert "| 0 | baseline | baseline | baseline | 1.16 / 1.16 |" in out and "ran at a load" not in out


def test_the_rerun_s_two_verdict_flips_are_borderline_and_its_metrics_still_count(capsys):
    """Each flipped verdict is one E2E p99 gate whose two estimates agree within their intervals: with
    --verdicts consistent they are listed, not counted; the moved metrics still are."""
    assert main([str(SMOLLM2), str(REPRO), *CHANGED, "--verdicts", "consistent"]) == 1
    out = capsys.readouterr().out
    assert "verdicts that differ (2 borderline; --verdicts consistent: borderline ones do not count):" in out
    assert ("latency_max_regression:perf/e2e_ms_p99: inconclusive in A (-8.8% [-33.1%, +24.1%]), pass in B "
            "(-26.1% [-45.7%, +0.6%]): the estimates differ by 0.209 in log ratio, within their intervals' combined "
            "half-width 0.436") in out
    assert "rungs kept (the ladder's decisions): the same at 7/7" in out
    reasons = out.split("not reproduced:", 1)[1]
    assert "verdict" not in reasons and "rung 1 (paged_kv): TPOT p50 (ms) 29.13 -> 37.89 (1.30×)" in reasons
    assert main([str(SMOLLM2), str(SMOLLM2), "--verdicts", "consistent"]) == 0


def _gate(ladder: dict, rung: int) -> dict:
    return next(g for g in ladder["rungs"][rung]["verdict"]["gates"] if g["gate"] == "latency_max_regression")


def test_a_contradiction_a_disagreement_and_another_kept_rung_count_in_either_mode(tmp_path, capsys):
    copy = _copy(tmp_path)

    def change(ladder):
        r3 = ladder["rungs"][3]  # pass in A: a fail here is a contradiction
        r3["status"] = r3["verdict"]["status"] = _gate(ladder, 3)["status"] = "fail"
        r2 = ladder["rungs"][2]  # inconclusive in A (-8.8% [-33.1%, +24.1%]): a pass far from it disagrees
        r2["status"] = r2["verdict"]["status"] = "pass"
        _gate(ladder, 2).update(status="pass", interval={"estimate": -0.80, "low": -0.85, "high": -0.74})
        ladder["rungs"][5]["kept"] = False
    _edit_ladder(copy, change)
    for mode in ("strict", "consistent"):
        assert main([str(SMOLLM2), str(copy), "--verdicts", mode]) == 1
        out = capsys.readouterr().out
        assert "rung 3 (dynamic_batching): verdict pass in A, fail in B (contradiction)" in out
        assert "rung 2 (flash_attn): verdict inconclusive in A, pass in B (disagreement)" in out
        assert "beyond their intervals' combined half-width" in out
        assert "rung 5 (batched_decode): kept True in A, False in B" in out
        assert "the same at 6/7" in out


def test_a_borderline_flip_counts_only_when_strict(tmp_path, capsys):
    copy = _copy(tmp_path)

    def flip(ladder):  # rung 2's gate moved a little, over its bound: -8.8% -> -12%, now passing
        r2 = ladder["rungs"][2]
        r2["status"] = r2["verdict"]["status"] = "pass"
        _gate(ladder, 2).update(status="pass", interval={"estimate": -0.12, "low": -0.30, "high": 0.05})
    _edit_ladder(copy, flip)
    assert main([str(SMOLLM2), str(copy)]) == 1
    assert "rung 2 (flash_attn): verdict inconclusive in A, pass in B (borderline)" in capsys.readouterr().out
    assert main([str(SMOLLM2), str(copy), "--verdicts", "consistent"]) == 0
    out = capsys.readouterr().out
    assert "1 borderline" in out and "\nreproduced" in out


def test_a_deciding_gate_only_one_run_has_is_a_disagreement(tmp_path, capsys):
    copy = _copy(tmp_path)

    def drop(ladder):  # B's rung 2 passes without its latency gate: not the same judgement, however close
        r2 = ladder["rungs"][2]
        r2["status"] = r2["verdict"]["status"] = "pass"
        r2["verdict"]["gates"] = [g for g in r2["verdict"]["gates"] if g["gate"] != "latency_max_regression"]
    _edit_ladder(copy, drop)
    assert main([str(SMOLLM2), str(copy), "--verdicts", "consistent"]) == 1
    out = capsys.readouterr().out
    assert "rung 2 (flash_attn): verdict inconclusive in A, pass in B (disagreement)" in out
    assert "latency_max_regression:perf/e2e_ms_p99: only in A (inconclusive)" in out


PAIR = RESULTS / "smollm2_ts2_40_pair"  # one ladder twice on one H200, one after the other (gpu_ladder_pair.sh)


def _scale(ladder: dict, factors: dict[tuple[int, str], float]) -> None:
    for (rung, key), f in factors.items():
        ladder["rungs"][rung]["metrics"][key] *= f


def test_a_few_metrics_outside_by_chance_are_listed_not_counted(tmp_path, capsys):
    """Identical runs leave some of many metrics outside 2 SDs (4.6% each): no more than the 95th percentile of that
    count over the metrics that moved by 1% or more counts as noise; one as improbable as --k-max SDs counts
    whatever; --per-metric counts each."""
    copy = _copy(tmp_path)
    small = {(r, key): 1.02 for r in range(7) for key in ("perf/ttft_ms_p50", "perf/tpot_ms_p50",
                                                            "perf/throughput_out_tok_s")}  # 21 that moved 2%
    tiny = {(r, "perf/peak_mem_gb"): 1.001 for r in range(7)}  # moved, but under 1%: no chance allowance
    _edit_ladder(copy, lambda ladder: _scale(ladder, {**small, **tiny, (3, "perf/e2e_ms_p99"): 1.3}))  # 22 moved
    assert main([str(SMOLLM2), str(copy)]) == 0
    out = capsys.readouterr().out
    assert ("1 metric(s) outside 2 SDs (none as improbable as 4 SDs of a normal), no more than identical runs leave outside by chance (up to "
            "3 of the 22 that moved by 1% or more (or lie outside), 95 times in 100): listed, not counted") in out
    assert "rung 3 (dynamic_batching): E2E p99 (ms)" in out and "(2.6 SDs)" in out and "\nreproduced" in out
    assert main([str(SMOLLM2), str(copy), "--per-metric"]) == 1
    # four outside 2 SDs among 22 that moved: more than chance
    _edit_ladder(copy, lambda ladder: _scale(ladder, {(r, "perf/e2e_ms_p99"): 1.3 for r in (0, 1, 2)}))
    assert main([str(SMOLLM2), str(copy)]) == 1
    out = capsys.readouterr().out
    assert ("4 metrics outside 2 SDs (none as improbable as 4 SDs of a normal): more than identical runs leave outside by chance (up to 3 of "
            "the 25 that moved by 1% or more (or lie outside)") in out and out.count("E2E p99 (ms) ") >= 4
    # one far out: 1.6x is 4.7 SDs of 0.10
    copy2 = _copy(tmp_path / "2")
    _edit_ladder(copy2, lambda ladder: _scale(ladder, {**small, (5, "perf/tpot_ms_p50"): 1.6}))
    assert main([str(SMOLLM2), str(copy2)]) == 1
    assert "(4.7 SDs): as improbable as 4 SDs or more" in capsys.readouterr().out
    assert main([str(SMOLLM2), str(copy2), "--k-max", "5"]) == 0
    with pytest.raises(SystemExit):
        main([str(SMOLLM2), str(copy2), "--k-max", "1.5"])  # below --k
    assert "--k-max=1.5: must be at least --k=2.0" in capsys.readouterr().err


def test_chance_outside_is_the_poisson_binomial_95th_percentile():
    from scipy.stats import binom

    for n in (1, 10, 22, 44, 60):
        assert chance_outside([0.0455] * n) == int(binom.ppf(0.95, n, 0.0455))
    assert chance_outside([]) == 0 and chance_outside([1.0, 1.0, 0.0]) == 2
    assert tail(2.0, 0) == pytest.approx(0.0455, abs=1e-4) and tail(2.0, 7) == pytest.approx(0.0856, abs=1e-3)


def test_noise_measured_by_an_earlier_pair_replaces_the_assumed_one(tmp_path, capsys):
    """--noise-from C D: each metric's SD is the RMS of ln(D / C) over the rungs (the H200 pair on one machine: E2E
    p99 0.139), never below --noise-sd, with Student's t tails; a move the assumed 0.10 counts is within it."""
    copy = _copy(tmp_path)
    _edit_ladder(copy, lambda ladder: _scale(ladder, {(3, "perf/e2e_ms_p99"): 1.3}))  # 0.262 in log ratio
    assert main([str(SMOLLM2), str(copy), "--per-metric"]) == 1
    capsys.readouterr()
    assert main([str(SMOLLM2), str(copy), "--per-metric", "--noise-from", str(PAIR / "a"), str(PAIR / "b")]) == 0
    out = capsys.readouterr().out
    assert "E2E p99 (ms) 0.139 (n=7, mean -0.085)" in out and "used at least 0.1" in out


def test_noise_from_refuses_what_is_not_a_measurement_of_noise(tmp_path, capsys):
    copy = _copy(tmp_path)
    cases = ((SMOLLM2, copy, SMOLLM2, REPRO, "another pair than the one compared"),  # the pair judging itself
             (SMOLLM2, copy, PAIR / "a", PAIR / "a", "C and D are the same run"),
             # the changed defaults not ignored: C and D are two ladders, their ratios effects
             (PAIR / "a", PAIR / "b", SMOLLM2, REPRO, "are not runs of one ladder (engine.piecewise_max_tokens"))
    for a, b, c, d, why in cases:
        assert main([str(a), str(b), "--noise-from", str(c), str(d)]) == 2
        assert why in capsys.readouterr().err
    copy_a = _copy(tmp_path / "copy-of-a", PAIR / "a")  # A again under another name
    assert main([str(PAIR / "a"), str(PAIR / "b"), "--noise-from", str(copy_a), str(SMOLLM2)]) == 2
    assert "the same ladder.json as A or B" in capsys.readouterr().err
    short = _copy(tmp_path / "short")
    _edit_ladder(short, lambda ladder: ladder["rungs"].pop())
    assert main([str(PAIR / "a"), str(PAIR / "b"), "--noise-from", str(SMOLLM2), str(short)]) == 2
    assert "--noise-from: the two ladders have other rungs" in capsys.readouterr().err
    few = _copy(tmp_path / "few", REPRO)  # only 4 rungs with a TPOT: not measured, --noise-sd stands
    _edit_ladder(few, lambda ladder: [r["metrics"].pop("perf/tpot_ms_p50") for r in ladder["rungs"][:3]])
    assert main([str(PAIR / "a"), str(PAIR / "b"), "--noise-from", str(SMOLLM2), str(few), *CHANGED]) == 1
    out = capsys.readouterr().out
    assert "TPOT p50" not in out.split("noise measured", 1)[1].split("\n", 1)[0]


def test_the_h200_pair_on_one_machine_has_the_same_verdicts_and_moved_eager_metrics(capsys):
    """The committed pair (benchmarks/results/gpu_ladder_h200/smollm2_ts2_40_pair): every verdict and kept rung the
    same, quality the same, cuda_graphs within noise; 10 metrics outside 2 x 0.10 (more than the 4 chance allows of
    the 31 that moved by 1% or more): not reproduced; with the noise the time-scale-2 pair measured on two machines,
    5 outside 2 SDs, as many as chance allows: reproduced."""
    assert main([str(PAIR / "a"), str(PAIR / "b")]) == 1
    out = capsys.readouterr().out
    assert "settings: 0 difference(s) (the same ladder)" in out
    assert "verdicts: 7/7 the same; metrics: 53/63 within 2 × 0.1" in out
    assert "rungs kept (the ladder's decisions): the same at 7/7" in out
    assert "10 metrics outside 2 SDs (none as improbable as 4 SDs of a normal): more than identical runs leave outside by chance (up to 4 of " \
           "the 31 that moved by 1% or more (or lie outside)" in out
    assert "rung 6 (cuda_graphs)" not in out.split("not reproduced:", 1)[1]
    assert main([str(PAIR / "a"), str(PAIR / "b"), "--noise-from", str(SMOLLM2), str(REPRO), *CHANGED]) == 0
    out = capsys.readouterr().out
    assert "E2E p99 (ms) 0.156 (n=7, mean +0.115)" in out
    # another ladder's noise (200 requests, not 40) is said to be one, where it is used
    assert ("note: the noise comes from a ladder with other settings than A's (C -> A): workload.num_requests: 200 -> "
            "40; requests_digest differs") in out
    assert "5 metric(s) outside 2 SDs (none as improbable as 4 SDs of a normal), no more than identical runs leave outside by chance (up to 5 " \
           "of the 31 that moved by 1% or more (or lie outside)" in out


def _interleave(ladder: dict) -> None:
    """As if each rung had run beside a run of its control (ladder.interleave): that run measured what the rung
    before measured."""
    rungs = ladder["rungs"]
    for r in rungs[1:]:
        ctl = rungs[r["rung"] - 1]
        r["control_beside"] = {"name": f"rung{ctl['rung']}-{ctl['opt'] or 'baseline'}-again-rung{r['rung']}-{r['opt']}",
                               "run_ids": ["x"], "metrics": {k: v for k, v in ctl["metrics"].items()
                                                             if not k.startswith("quality/")}}


def _drift(ladder: dict, rung: int, factor: float, control_too: bool = True) -> None:
    """The machine ran `factor` slower through rung `rung`: its timed figures (and its control's run beside it)."""
    from optladder.experiments.ladder_compare import TIMED

    row = ladder["rungs"][rung]
    for m in [row["metrics"], *([row["control_beside"]["metrics"]] if control_too and rung else [])]:
        for key in TIMED:
            if key in m:
                m[key] *= 1 / factor if key == "perf/throughput_out_tok_s" else factor


def test_interleaved_ladders_are_compared_by_each_rung_s_change_against_the_control_beside_it(tmp_path, capsys):
    a, b = _copy(tmp_path / "a"), _copy(tmp_path / "b")
    for x in (a, b):
        _edit_ladder(x, _interleave)
    # the machine drifted: 1.5x slower through the baseline and rungs 2 and 5 of B, their controls' runs alike
    _edit_ladder(b, lambda ladder: [_drift(ladder, i, 1.5) for i in (0, 2, 5)])
    assert main([str(a), str(b)]) == 0  # auto: both interleaved, changes compared
    out = capsys.readouterr().out
    assert "against its control run beside it" in out and "\nreproduced" in out
    assert "| 5166 -> 7750 (shown) |" in out  # the baseline's TTFT p50: the machine's speed, shown, not judged
    assert main([str(a), str(b), "--figures", "absolute"]) == 1  # as they are, the drift counts
    assert "rung 2 (flash_attn): TTFT p50 (ms) 4495 -> 6743 (1.50×), outside" in capsys.readouterr().out
    # the rung slower and not its control: its change moved, named as a change; 1.4x is 2.4 SDs of sqrt(2) x 0.10
    _edit_ladder(b, lambda ladder: _drift(ladder, 3, 1.4, control_too=False))
    assert main([str(a), str(b), "--per-metric"]) == 1
    out = capsys.readouterr().out
    assert ("rung 3 (dynamic_batching): E2E p99 vs its control beside it 0.6823 -> 0.9553 (1.40×), outside ±0.28"
            in out)
    assert "(2.4 SDs)" in out


def test_changes_need_both_ladders_interleaved(tmp_path, capsys):
    a = _copy(tmp_path / "a")
    _edit_ladder(a, _interleave)
    assert main([str(a), str(SMOLLM2), "--figures", "changes"]) == 2
    assert "B ran without ladder.interleave" in capsys.readouterr().err
    assert main([str(a), str(SMOLLM2)]) in (0, 1)  # auto: compared as they are
    assert "against its control run beside it" not in capsys.readouterr().out
    b = _copy(tmp_path / "b")
    _edit_ladder(b, _interleave)
    assert main([str(a), str(b), "--noise-from", str(PAIR / "a"), str(PAIR / "b")]) == 2
    assert "C or D ran without ladder.interleave" in capsys.readouterr().err


INTERLEAVED = RESULTS / "smollm2_ts2_24_interleaved_pair"  # ladder.interleave=true, twice on one H200


def test_the_interleaved_h200_pair_fails_its_preregistered_check_on_two_ttft_changes(capsys):
    """The check fixed before its data: by default (changes against the runs beside the rungs, the assumed 0.10) the
    pair does not reproduce, on the static batch's TTFT p50 at paged_kv and dynamic_batching (4.7 and 4.6 SDs);
    every verdict and kept rung the same."""
    assert main([str(INTERLEAVED / "a"), str(INTERLEAVED / "b")]) == 1
    out = capsys.readouterr().out
    assert "verdicts: 7/7 the same" in out and "rungs kept (the ladder's decisions): the same at 7/7" in out
    reasons = out.split("not reproduced:\n", 1)[1]
    assert "rung 1 (paged_kv): TTFT p50 vs its control beside it 1.108 -> 2.165 (1.95×)" in reasons
    assert "rung 3 (dynamic_batching): TTFT p50 vs its control beside it" in reasons and "(4.6 SDs)" in reasons
    assert "| 0 | baseline | baseline | baseline | 0.96 / 0.94 | 2086 -> 2228 (shown) |" in out


def test_noise_within_measures_the_noise_on_the_a_a_pairs_inside_the_ladders(capsys):
    """Each control run beside a rung is its control again: 6 A/A pairs a ladder. Static batching's TTFT p50 moved
    0.61-1.54x between identical runs minutes apart (RMS 0.281 over 12 pairs), so a change's difference has SD
    sqrt(2) x 0.281 = 0.398, and the pair's 1.95x (0.67) lies within 2 SDs."""
    from optladder.abtest.ladder import noise_beside
    from optladder.experiments.ladder_compare import noise_within

    a, b = (json.loads((INTERLEAVED / x / "ladder.json").read_text()) for x in ("a", "b"))
    sd, n, _ = noise_beside(a["rungs"])["perf/ttft_ms_p50"]
    assert n == 6 and sd == pytest.approx(0.270, abs=5e-4)
    both = noise_within(a, b)
    assert both["perf/ttft_ms_p50"][1] == 12 and both["perf/ttft_ms_p50"][0] == pytest.approx(0.398, abs=5e-4)
    assert main([str(INTERLEAVED / "a"), str(INTERLEAVED / "b"), "--noise-within"]) == 0
    out = capsys.readouterr().out
    assert "TTFT p50 (ms) 0.398 (n=12, mean -0.071)" in out and "\nreproduced" in out
    # the control of rung i is the rung accepted before it, not rung i-1: a left-out rung is skipped
    rungs = [{**r, "metrics": dict(r["metrics"])} for r in a["rungs"][:3]]
    rungs[1] = {**rungs[1], "accepted_rung": 0}  # rung 1 not kept: rung 2's control is the baseline
    rungs[0]["metrics"]["perf/ttft_ms_p50"] = rungs[2]["control_beside"]["metrics"]["perf/ttft_ms_p50"] / 2
    d1 = math.log(rungs[1]["control_beside"]["metrics"]["perf/ttft_ms_p50"] / rungs[0]["metrics"]["perf/ttft_ms_p50"])
    assert noise_beside(rungs)["perf/ttft_ms_p50"] == pytest.approx(
        (math.sqrt((d1 ** 2 + math.log(2) ** 2) / 2), 2, (d1 + math.log(2)) / 2))


def test_noise_within_needs_interleaved_ladders_and_no_other_noise(capsys):
    for extra, why in (([str(SMOLLM2), str(SMOLLM2)], "A and B ran without it"),
                       ([str(INTERLEAVED / "a"), str(INTERLEAVED / "b"), "--figures", "absolute"],
                        "--figures absolute given"),
                       ([str(INTERLEAVED / "a"), str(INTERLEAVED / "b"), "--noise-from", str(PAIR / "a"),
                         str(PAIR / "b")], "give one way to measure the noise")):
        assert main([*extra, "--noise-within"]) == 2
        assert why in capsys.readouterr().err


POOLED = RESULTS / "smollm2_ts2_24_interleaved_pooled"  # 2026-12-03, at e08e33a: the gates pooled the A/A pairs


def _cut(tmp_path: Path, src: Path, rungs: int, name: str = "cut") -> Path:
    """src's ladder as if cut short after `rungs` rows (ladder.json written after every rung, complete false)."""
    dst = tmp_path / name
    (dst / "rung0-baseline-r0").mkdir(parents=True)
    shutil.copy(src / "rung0-baseline-r0" / SNAPSHOT_FILE, dst / "rung0-baseline-r0")
    ladder = json.loads((src / "ladder.json").read_text())
    planned = [r["opt"] for r in ladder["rungs"][1:]]
    ladder.update(rungs=ladder["rungs"][:rungs], complete=False, planned=planned)
    (dst / "ladder.json").write_text(json.dumps(ladder))
    return dst


def test_a_ladder_cut_short_is_compared_on_the_rungs_both_reached(tmp_path, capsys):
    """A cut ladder against the whole one: its rungs are compared, the rest is named and counts, unless --partial;
    the previous pair's ladder a against this one cut to four rows: the pooled gates passed paged_kv in one only."""
    cut = _cut(tmp_path, POOLED / "a", 4)
    assert main([str(POOLED / "a"), str(cut), "--noise-within"]) == 1
    out = capsys.readouterr().out
    assert "B cut short (ladder.json complete: false): rungs 0-3 compared, 3 not (chunked_prefill, batched_decode, " \
           "cuda_graphs) (the rungs not compared count as not reproduced" in out
    assert "verdicts: 4/4 the same" in out and "- B cut short: chunked_prefill, batched_decode, cuda_graphs not " \
                                               "compared" in out
    assert main([str(POOLED / "a"), str(cut), "--noise-within", "--partial"]) == 0
    out = capsys.readouterr().out
    assert "\nreproduced" in out and "count as not reproduced" not in out and "rungs 0-3 compared" in out
    assert main([str(INTERLEAVED / "a"), str(cut), "--noise-within", "--partial"]) == 1
    assert "rung 1 (paged_kv): verdict inconclusive in A, pass in B" in capsys.readouterr().out
    # A the cut one, B cut shorter still: the rungs both reached
    shorter = _cut(tmp_path, POOLED / "a", 3, "shorter")
    assert main([str(cut), str(shorter)]) == 1
    out = capsys.readouterr().out
    assert "A and B cut short (ladder.json complete: false): rungs 0-2 compared, 4 not (dynamic_batching, " in out
    # not marked complete, every planned rung there (a write before the last one): compared whole, no reason added
    whole = _cut(tmp_path, POOLED / "a", 7, "whole")
    assert main([str(POOLED / "a"), str(whole)]) == 0
    out = capsys.readouterr().out
    assert "B not marked complete, all 6 planned rungs there: compared" in out and "count as not" not in out
    # cut before its first rung: nothing but the baselines
    bare = _cut(tmp_path, POOLED / "a", 1, "bare")
    assert main([str(POOLED / "a"), str(bare), "--partial"]) == 2
    assert "B cut short before its first rung" in capsys.readouterr().err
    # a ladder cut short that planned other rungs is not the same ladder
    other = _cut(tmp_path, POOLED / "a", 3, "other")
    _edit_ladder(other, lambda x: x.update(planned=["paged_kv", "flash_attn"]))
    assert main([str(POOLED / "a"), str(other)]) == 2
    assert "the ladders planned other rungs" in capsys.readouterr().err


def test_the_pooled_ladder_says_its_static_rungs_ran_at_capacity():
    """ladder.md names each run's load, the controls' beside the rungs too, where one ran at 0.8 or more: the
    static batch at 0.92-1.09 here."""
    from optladder.abtest.ladder import ladder_table

    rows = json.loads((POOLED / "a" / "ladder.json").read_text())["rungs"]
    md = ladder_table(rows)
    assert "rung 0 1.08, rung 1 0.92, rung 2 0.99, rung 3 0.79" in md and "its control beside rung 2 1.09" in md
    assert "can get another verdict in the next run" in md
    assert load(rows[6]["metrics"]) == pytest.approx(0.18, abs=0.005)
    calm = [{**r, "metrics": {k: v for k, v in r["metrics"].items() if k != "stage/decode_ms_mean"}} for r in rows]
    calm = [{k: v for k, v in r.items() if k != "control_beside"} for r in calm]
    assert "Load, estimated" not in ladder_table(calm)  # without the step timers nothing is said


TS4 = RESULTS / "smollm2_ts4_24_interleaved_pooled"  # 2026-12-03: ladders A-D, one H200 each, the same ladder code


def test_the_time_scale_4_pair_fails_its_preregistered_strict_check_on_flash_attn_s_borderline_flip(capsys):
    """The check fixed before B's data (--noise-within, strict verdicts): flash_attn inconclusive in A, pass in B,
    a borderline flip (its E2E p99 gate's estimates within their intervals); every rung kept the same."""
    assert main([str(TS4 / "a"), str(TS4 / "b"), "--noise-within"]) == 1
    out = capsys.readouterr().out
    assert "verdicts: 6/7 the same" in out and "rungs kept (the ladder's decisions): the same at 7/7" in out
    reasons = out.split("not reproduced:\n", 1)[1]
    assert reasons.startswith("- rung 2 (flash_attn): verdict inconclusive in A, pass in B (borderline)")
    assert "the estimates differ by 0.368 in log ratio, within their intervals' combined half-width 0.568" in out


KV = "perf/kv_reserved_gb"


def _aa(ladder: dict) -> list[tuple[dict, dict]]:
    """(a control's own run's metrics, its run beside the next rung's), rung by rung: the A/A pairs."""
    rows = {r["rung"]: r for r in ladder["rungs"]}
    return [(rows[before["accepted_rung"]]["metrics"], r["control_beside"]["metrics"])
            for before, r in zip(ladder["rungs"], ladder["rungs"][1:])]


def test_noise_within_measures_kv_reserved_on_the_a_a_pairs_and_compares_it_as_it_is(tmp_path, capsys):
    """How much KV a replay reserves follows which requests overlapped: the same config reserved 0.69-1.36x as
    much minutes apart (RMS 0.217 over the 12 pairs), where an assumed 0.10 made three KV figures count. A figure
    compared as it is (one run against one) differs between the ladders with the pairs' RMS itself, a change with
    sqrt(2) times it."""
    from optladder.abtest.ladder import noise_beside
    from optladder.experiments.ladder_compare import noise_within

    a, b = (json.loads((TS4 / x / "ladder.json").read_text()) for x in ("a", "b"))
    logs = [math.log(beside[KV] / own[KV]) for x in (a, b) for own, beside in _aa(x)]
    rms = math.sqrt(sum(v * v for v in logs) / len(logs))
    assert rms == pytest.approx(0.217, abs=5e-4)
    both = noise_within(a, b)
    assert both[KV][:2] == (pytest.approx(rms), 12)
    ttft = [noise_beside(x["rungs"])["perf/ttft_ms_p50"][0] for x in (a, b)]
    assert both["perf/ttft_ms_p50"][0] == pytest.approx(math.sqrt(2) * math.sqrt((ttft[0] ** 2 + ttft[1] ** 2) / 2))
    assert main([str(TS4 / "a"), str(TS4 / "b"), "--noise-within", "--verdicts", "consistent"]) == 0
    out = capsys.readouterr().out
    assert "KV reserved (GiB) 0.217 (n=12, mean -0.106)" in out and "\nreproduced" in out
    assert "3 metric(s) outside 2 SDs" in out and "KV reserved (GiB) 0.4395" not in out
    # the runs beside the rungs reserving what their controls did: nothing measured, the band the assumed 0.10,
    # and the ladders' own KV moves count (six figures outside where chance leaves up to four)
    calm = [_copy(tmp_path / x, TS4 / x) for x in ("a", "b")]

    def same_kv(ladder: dict) -> None:
        for own, beside in _aa(ladder):
            beside[KV] = own[KV]

    for x in calm:
        _edit_ladder(x, same_kv)
    assert KV not in noise_within(*(json.loads((x / "ladder.json").read_text()) for x in calm))
    assert main([*map(str, calm), "--noise-within", "--verdicts", "consistent"]) == 1
    out = capsys.readouterr().out
    assert "rung 4 (chunked_prefill): KV reserved (GiB) 0.1483 -> 0.102 (0.69×), outside ±0.20" in out
    assert "6 metrics outside 2 SDs" in out
    # fewer than MIN_NOISE_RUNGS pairs measure nothing: a ladder cut after rung 2 holds two
    short = json.loads((_cut(tmp_path, TS4 / "a", 3) / "ladder.json").read_text())
    assert noise_within(short) == {} and set(noise_within(a)) >= {KV, "perf/e2e_ms_p99"}


def test_ladder_c_reproduces_b_and_not_a_the_check_fixed_before_its_data(capsys):
    """The check fixed before C's data: --noise-within --verdicts consistent against A and against B, reproduced
    iff both exit 0. C against B exits 0 (strict as well); C against A exits 1 on six figures outside 2 SDs, where
    chance leaves up to four, flash_attn's flip again borderline and not counted."""
    for x, strict in (("b", 0), ("a", 1)):
        assert main([str(TS4 / x), str(TS4 / "c"), "--noise-within"]) == strict
    capsys.readouterr()
    assert main([str(TS4 / "b"), str(TS4 / "c"), "--noise-within", "--verdicts", "consistent"]) == 0
    out = capsys.readouterr().out
    assert "verdicts: 7/7 the same" in out and "\nreproduced" in out
    assert main([str(TS4 / "a"), str(TS4 / "c"), "--noise-within", "--verdicts", "consistent"]) == 1
    out = capsys.readouterr().out
    assert "- rung 2 (flash_attn): inconclusive in A, pass in B: borderline" in out
    reasons = out.split("not reproduced:\n", 1)[1]
    assert "verdict inconclusive in A" not in reasons and "6 metrics outside 2 SDs" in reasons
    assert "rung 2 (flash_attn): E2E p99 vs its control beside it" in reasons


def test_ladder_d_reproduces_a_b_and_c_the_check_fixed_before_its_data(tmp_path, capsys):
    """The check fixed before D's data: `ladder_compare X d --noise-within --verdicts consistent` for X in a, b and
    c, reproduced iff at least two exit 0. All three do; strict (reported beside) only against A, because
    flash_attn's borderline flip (inconclusive in A and D, pass in B and C) counts there. A D whose all-on rung
    served half the throughput against its control fails against every one of them."""
    for x, strict in (("a", 0), ("b", 1), ("c", 1)):
        assert main([str(TS4 / x), str(TS4 / "d"), "--noise-within"]) == strict
        out = capsys.readouterr().out
        assert "rungs kept (the ladder's decisions): the same at 7/7" in out
        assert "2 metric(s) outside 2 SDs (none as improbable as 4 SDs of a normal)" in out
        if strict:
            assert "- rung 2 (flash_attn): verdict pass in A, inconclusive in B (borderline)" in out
    assert [main([str(TS4 / x), str(TS4 / "d"), "--noise-within", "--verdicts", "consistent"])
            for x in "abc"] == [0, 0, 0]
    assert capsys.readouterr().out.count("\nreproduced\n") == 3
    slow = _copy(tmp_path, TS4 / "d")

    def half(ladder: dict) -> None:  # the last rung's own run is no A/A pair's: the measured noise stays as it was
        ladder["rungs"][6]["metrics"]["perf/throughput_out_tok_s"] *= 0.5
    _edit_ladder(slow, half)
    for x in "abc":
        assert main([str(TS4 / x), str(slow), "--noise-within", "--verdicts", "consistent"]) == 1
        reasons = capsys.readouterr().out.split("not reproduced:\n", 1)[1]
        assert "- rung 6 (cuda_graphs): throughput vs its control beside it" in reasons
        assert "as improbable as 4 SDs or more" in reasons


def test_each_rung_s_decode_step_per_row_is_printed_beside_its_control_s_and_not_judged(tmp_path, capsys):
    """The engine's own speed apart from its queue's path: a rung's ms per decode row against its control run
    beside it, in A and in B, with the decode steps each took. It explains a moved change (flash_attn's gated run
    saved 2% per row in A, 18% in C) and decides nothing."""
    from optladder.experiments.ladder_compare import row_ms, step_costs

    a, c = (json.loads((TS4 / x / "ladder.json").read_text()) for x in ("a", "c"))
    flash = {name: text for name, text in step_costs(c["rungs"])}["rung 2 (flash_attn)"]
    own, beside = c["rungs"][2]["metrics"], c["rungs"][2]["control_beside"]["metrics"]
    expected = own["stage/decode_ms_mean"] / own["perf/step_decode_tokens_mean"]
    assert row_ms(own) == pytest.approx(expected)
    control = beside["stage/decode_ms_mean"] / beside["perf/step_decode_tokens_mean"]
    assert flash == (f"{control:.1f} -> {expected:.1f} ms ({expected / control - 1:+.0%}), "
                     f"{beside['perf/steps']:,.0f} -> {own['perf/steps']:,.0f} steps")
    assert main([str(TS4 / "a"), str(TS4 / "c"), "--noise-within", "--verdicts", "consistent"]) == 1
    out = capsys.readouterr().out
    assert f"  rung 2 (flash_attn): A {dict(step_costs(a['rungs']))['rung 2 (flash_attn)']}; B {flash}\n" in out
    assert "(-2%)" in out.split("rung 2 (flash_attn): A ", 1)[1].split(";")[0]
    # reported, not judged: B's own runs twice as slow per step change the lines and nothing else
    copy = _copy(tmp_path, TS4 / "c")

    def slower(ladder: dict) -> None:
        for r in ladder["rungs"]:
            r["metrics"]["stage/decode_ms_mean"] *= 2
        del ladder["rungs"][4]["control_beside"]["metrics"]["stage/decode_ms_mean"]  # no timer: left out
    _edit_ladder(copy, slower)
    assert main([str(TS4 / "b"), str(copy), "--noise-within", "--verdicts", "consistent"]) == 0
    out = capsys.readouterr().out
    assert "\nreproduced" in out and "rung 4 (chunked_prefill): A" not in out
    assert "rung 2 (flash_attn): A" in out and f"-> {2 * expected:.1f} ms" in out
    assert row_ms({"stage/decode_ms_mean": 30.0}) is None and row_ms({}) is None
    assert row_ms({"stage/decode_ms_mean": 30.0, "perf/step_decode_tokens_mean": 0}) is None
    # a ladder without runs beside its rungs has nothing to print, and says nothing
    plain = [{k: v for k, v in r.items() if k != "control_beside"} for r in c["rungs"]]
    assert step_costs(plain) == []
    assert main([str(SMOLLM2), str(SMOLLM2)]) == 0 and "decode step per row" not in capsys.readouterr().out
