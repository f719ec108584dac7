"""Data checks that tell the truth: a CSV cut short, JSON errors with line and column, what the prompts were
really made of, and how many requests max_model_len clipped with the setting that avoids it."""
from __future__ import annotations

import json

import pytest

from optladder.traffic.traces import load_trace
from optladder.traffic.workload import WorkloadConfig, build_workload

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


class CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


TOK = CharTokenizer()


def test_a_csv_whose_last_line_has_no_line_ending_is_flagged(tmp_path):
    rows = "2023-11-16 18:15:46.1,374,44\n2023-11-16 18:15:47.2,100,12"
    cut = tmp_path / "cut.csv"
    cut.write_text(HEADER + rows)  # the last row parses, but its 12 may have been 120
    assert "may have been cut short" in load_trace("azure", str(cut)).warnings[0]
    whole = tmp_path / "whole.csv"
    whole.write_text(HEADER + rows + "\n")
    assert load_trace("azure", str(whole)).warnings == []
    w = build_workload(WorkloadConfig(name="azure_conv", path=str(cut), num_requests=2, arrival="poisson"), TOK,
                       4096)
    assert any("cut short" in x for x in w.warnings)


def test_invalid_sharegpt_json_names_line_and_column(tmp_path):
    bad = tmp_path / "sg.json"
    bad.write_text('[\n  {"id": "a", "conversations": []},\n  {"id": "b" "conversations": []}\n]\n')
    with pytest.raises(ValueError, match=rf"{bad}:3:\d+: not valid JSON"):
        load_trace("sharegpt", str(bad))


def test_sharegpt_prompts_are_labelled_by_the_text_they_came_from(tmp_path):
    conv = [{"id": str(i), "conversations": [{"from": "human", "value": f"question number {i} " * 3}]}
            for i in range(5)]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(conv))
    w = build_workload(WorkloadConfig(name="sharegpt", path=str(path), num_requests=5), TOK, 4096, data_root=None)
    assert "5 of 5 from the trace's own prompt text" in w.source and "builtin_text" not in w.source
    built = build_workload(WorkloadConfig(num_requests=4), TOK, 4096)
    assert "4 of 4 cut from" in built.source and "builtin_text.txt" in built.source


def test_clipping_warning_gives_the_share_and_the_settings_that_fit(tmp_path):
    rows = [{"timestamp": i * 100, "input_length": 3000 + 100 * i, "output_length": 50,
             "hash_ids": list(range(10 * i, 10 * i + 6))} for i in range(5)]
    rows.append({"timestamp": 600, "input_length": 500, "output_length": 20, "hash_ids": [99]})
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = build_workload(WorkloadConfig(name="mooncake", path=str(path), num_requests=6, sampling="head"), TOK, 2048)
    msg = next(x for x in w.warnings if "exceed engine.max_model_len" in x)
    assert "5 of 6 requests (83%) exceed engine.max_model_len=2048 and were clipped" in msg
    assert "engine.max_model_len=3450 fits them all" in msg  # the longest: 3400 + 50
    assert "workload.block_tokens=300" in msg  # 512 * (2048 - 50) / 3400 = 300.9, rounded down
    assert "Most requests changed" in msg
    fits = build_workload(WorkloadConfig(name="mooncake", path=str(path), num_requests=6, sampling="head",
                                         block_tokens=300), TOK, 2048)
    assert fits.stats["traffic/changed_lengths"] == 0
