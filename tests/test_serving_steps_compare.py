"""benchmarks/serving_steps_compare.py: decode-only steps of two engines at equal rows, from their step logs."""
import gzip
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import serving_steps_compare as sc  # noqa: E402


def test_ours_counts_decode_only_steps_and_vllm_the_spacing_after_a_decode_only_one():
    ours = {"step_log": [[0, 6.0, 0, 10], [6, 30.0, 500, 10], [36, 7.0, 0, 20], [43, 1.0, 0, 0]]}
    assert sc.ours_steps(ours) == [(10, 6.0), (20, 7.0)]
    # vLLM: [recorded ms, the core's wait, prompt, decode]; a decode-only record after one with prompt work is left
    # out, and so is the one just before it (its spacing holds that step's launch)
    vllm = {"step_log": [[5.0, 1, 0, 10], [10.0, 1, 0, 10], [15.5, 1, 0, 11], [35.0, 1, 0, 11], [40.0, 1, 300, 11],
                         [46.0, 1, 0, 12], [52.5, 1, 0, 12], [58.0, 1, 0, 12]]}
    assert sc.vllm_steps(vllm) == [(10, 5.0), (11, 5.5), (12, 6.5)]
    # the first version's rows (2026-12-02's results): [recorded - wait, wait, prompt, decode, recorded]
    first = {"step_log": [[r[0] - 1, 1, r[2], r[3], r[0]] for r in vllm["step_log"]]}
    assert sc.vllm_steps(first) == [(10, 5.0), (11, 5.5), (12, 6.5)]
    # steps with prompt work, each with the step before it: vLLM's two spacings (19.5 + 5.0), ours two durations
    assert sc.vllm_prompt_pairs(vllm) == [(300, 24.5)]
    assert sc.vllm_prompt_pairs(first) == [(300, 24.5)]
    assert sc.ours_prompt_pairs(ours) == []  # its step with prompt work is the second: no pair starts before the third
    ours2 = {"step_log": [[0, 5.0, 0, 9], [5, 6.0, 0, 10], [11, 30.0, 500, 10], [41, 7.0, 0, 11],
                          [48, 9.0, 40, 11], [57, 6.0, 0, 11]]}
    assert sc.ours_prompt_pairs(ours2) == [(500, 36.0)]  # the second has a step with prompt work two before it


def test_a_pair_needs_decode_only_steps_around_it():
    d = lambda t: [0, t, 0, 8]  # noqa: E731  (ours: [start, ms, prompt, decode])
    pr = lambda t, n: [0, t, n, 8]  # noqa: E731
    log = [d(5.0), d(5.0), pr(20.0, 100), pr(21.0, 200), d(5.0), d(6.0), pr(30.0, 300), d(5.0), d(5.0), pr(9.0, 50)]
    # 100: the next step has prompt work; 200: the step before has; 50: the last, nothing after it to check
    assert sc.ours_prompt_pairs({"step_log": log}) == [(300, 36.0)]


def test_the_pairs_table_bins_by_prompt_tokens():
    lines = sc.pairs_table([(100, 20.0), (300, 22.0), (1000, 40.0), (1600, 60.0)],
                           [(512, 16.0), (513, 36.0), (1024, 38.0), (1600, 50.0)], 512)
    assert lines[2] == "| 1-512 | 2, 21.00 | 1, 16.00 | 1.31× |"  # 512 on the bin's upper edge, 513 past it
    assert lines[3] == "| 513-1024 | 1, 40.00 | 2, 37.00 | 1.08× |"
    assert lines[4] == "| 1537-2048 | 1, 60.00 | 1, 50.00 | 1.20× |"  # the empty bin between left out
    assert len(lines) == 5


def test_the_table_sets_medians_side_by_side_by_rows(tmp_path, capsys):
    ours = [(r, 5.0 + 0.1 * r) for r in range(1, 40)]
    theirs = [(r, 5.0 + 0.05 * r) for r in range(1, 40)]
    lines = sc.table(ours, theirs, width=16)
    assert lines[2] == "| 1-16 | 16, 5.85 | 16, 5.43 | 1.08× |"  # medians at 8.5 rows
    assert lines[4].startswith("| 33-48 | 7, ") and lines[4].endswith("|")
    assert any(line.startswith("optladder: a decode-only step 5.00 ms + 0.1000 ms a row") for line in lines)
    assert any(line.startswith("vLLM: a decode-only step 5.00 ms + 0.0500 ms a row") for line in lines)
    # the files: a gzipped run of ours, a plain one of vLLM's; a scale neither has is refused, naming theirs
    o = tmp_path / "ours.json.gz"
    with gzip.open(o, "wt") as f:
        json.dump({"replay": {"4": [{"step_log": [[0, 6.0, 0, 3], [6, 7.0, 0, 3]]}]}}, f)
    v = tmp_path / "vllm.json"
    v.write_text(json.dumps({"replay": {"4": [{"step_log": [[1.0, 1, 0, 3], [6.0, 1, 0, 3], [11.0, 1, 0, 3]]}]}}))
    assert sc.main(["--ours", str(o), "--vllm", str(v)]) == 0
    printed = capsys.readouterr().out
    assert "| 1-16 | 2, 6.50 | 1, 5.00 | 1.30× |" in printed and "A step with prompt work" in printed
    assert sc.main(["--ours", str(o), "--vllm", str(v), "--scale", "8"]) == 2
    assert "no step log of repeat 0 at time scale 8 (scales there: 4)" in capsys.readouterr().err


@pytest.mark.parametrize("pts", [[], [(3, 1.0)], [(3, 1.0), (3, 2.0)]])
def test_no_line_without_two_distinct_row_counts(pts):
    assert sc.line(pts) is None
