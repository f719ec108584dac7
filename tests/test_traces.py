"""Trace loaders on small files written here, every bad-input message, and the real Azure trace."""
import json
import re

import pytest

from tests.conftest import data_root
from optladder.traffic.traces import load_trace, resolve_data_path

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_FILE = "traces/azure_conv_2023.csv"


class CharTokenizer:
    """One token per character: stateless, so counts are easy to check by eye."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_azure_keeps_sub_microsecond_precision(tmp_path):
    path = write(tmp_path, "az.csv", AZURE_HEADER + "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:46.6805901,396,109\n2023-11-16 18:15:50,10,1\n"
                 "2023-11-17 00:00:00.5,7,2")
    t = load_trace("azure", path)
    assert [r.input_len for r in t.rows] == [374, 396, 10, 7]
    assert [r.output_len for r in t.rows] == [44, 109, 1, 2]
    assert t.rows[0].timestamp_s == 0.0
    assert t.rows[1].timestamp_s == pytest.approx(1e-7, abs=1e-12)  # the 7th digit survives
    assert t.rows[2].timestamp_s == pytest.approx(50 - 46.68059, abs=1e-9)
    assert t.rows[3].timestamp_s == pytest.approx(5 * 3600 + 44 * 60 + 13.81941, abs=1e-9)
    assert (t.skipped, t.reordered, t.has_timing) == (0, 0, True)


def test_mooncake_ms_to_seconds_and_hash_ids(tmp_path):
    path = write(tmp_path, "mc.jsonl", jsonl([
        {"timestamp": 1000, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 1250, "input_length": 600, "output_length": 7, "hash_ids": [1, 3]}]))
    t = load_trace("mooncake", path)
    assert [r.timestamp_s for r in t.rows] == [0.0, 0.25]
    assert [r.hash_ids for r in t.rows] == [[1, 2], [1, 3]]


def test_jsonl_counts_text_and_timing(tmp_path):
    path = write(tmp_path, "log.jsonl", jsonl([
        {"timestamp": 10.5, "prompt": "hello", "output_tokens": 3},
        {"timestamp": 11.0, "input_tokens": 40, "output": "ab"},
        {"timestamp": 12.0, "prompt": "xyz", "input_tokens": 9, "output_tokens": 1}]))
    t = load_trace("jsonl", path, tokenizer=CharTokenizer())
    assert [(r.timestamp_s, r.input_len, r.output_len) for r in t.rows] == [
        (0.0, 5, 3), (0.5, 40, 2), (1.5, 9, 1)]  # a recorded count wins over the text
    assert t.rows[0].prompt_text == "hello" and t.rows[1].output_text == "ab"


def test_jsonl_without_timestamps_has_no_timing(tmp_path):
    path = write(tmp_path, "log.jsonl", jsonl([{"input_tokens": 4, "output_tokens": 2}] * 3))
    t = load_trace("jsonl", path)
    assert not t.has_timing and len(t.rows) == 3


def test_jsonl_partial_timestamps_and_missing_tokenizer(tmp_path):
    mixed = write(tmp_path, "mixed.jsonl", jsonl([{"timestamp": 1, "input_tokens": 4, "output_tokens": 2},
                                                  {"input_tokens": 4, "output_tokens": 2}]))
    with pytest.raises(ValueError, match="1 of 2 rows have no timestamp"):
        load_trace("jsonl", mixed)
    text = write(tmp_path, "text.jsonl", jsonl([{"prompt": "hi", "output_tokens": 2}] * 2))
    with pytest.raises(ValueError, match="tokenizer"):
        load_trace("jsonl", text)


def test_sharegpt_first_human_turn_and_bad_entries(tmp_path):
    data = [{"id": "a", "conversations": [{"from": "human", "value": "tell me"},
                                          {"from": "gpt", "value": "sure!"}]},
            {"id": "b", "conversations": [{"from": "gpt", "value": "no human here"}]},
            {"id": "c", "conversations": [{"from": "system", "value": "sys"},
                                          {"from": "human", "value": "second"}]}]
    path = write(tmp_path, "sg.json", json.dumps(data))
    with pytest.raises(ValueError, match=r"sg\.json:entry 2 \(id 'b'\): no human turn"):
        load_trace("sharegpt", path, tokenizer=CharTokenizer())
    t = load_trace("sharegpt", path, on_bad_row="skip", tokenizer=CharTokenizer())
    assert t.skipped == 1 and not t.has_timing
    assert [(r.prompt_text, r.input_len, r.output_len) for r in t.rows] == [
        ("tell me", 7, 5), ("second", 6, 0)]


def test_missing_file_names_path_and_data_root(tmp_path, monkeypatch):
    monkeypatch.delenv("OPTLADDER_DATA", raising=False)
    with pytest.raises(FileNotFoundError) as e:
        load_trace("azure", "traces/nope.csv", data_root=str(tmp_path))
    msg = str(e.value)
    assert "traces/nope.csv" in msg and str(tmp_path) in msg
    assert "data.root" in msg and "OPTLADDER_DATA" in msg
    with pytest.raises(FileNotFoundError, match="no data root set"):
        resolve_data_path("traces/nope.csv", None)


def test_a_directory_is_not_reported_as_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("OPTLADDER_DATA", raising=False)
    (tmp_path / "traces").mkdir()
    for name in ("a.csv", "b.jsonl", "c.csv", "d.csv", "e.csv", "f.csv"):
        (tmp_path / "traces" / name).write_text("")
    with pytest.raises(IsADirectoryError) as e:
        load_trace("azure", "traces", data_root=str(tmp_path))
    assert str(e.value) == (f"data file 'traces' is a directory ({tmp_path / 'traces'}), not a file: give the path "
                            f"of the file itself (it holds a.csv, b.jsonl, c.csv, d.csv, e.csv, ...)")
    assert "data.root" not in str(e.value)  # the data root is right: setting it again would not help
    (tmp_path / "empty").mkdir()
    with pytest.raises(IsADirectoryError, match=r"is a directory .*\(it holds no files\)$"):
        load_trace("mooncake", str(tmp_path / "empty"))


def test_a_directory_as_the_workload_path_is_a_user_error(tmp_path):
    from optladder.experiments.errors import UserError, as_user_error
    from optladder.traffic.workload import WorkloadConfig, build_workload
    from tests.test_workload import TOK

    with pytest.raises(UserError, match="is a directory"):
        with as_user_error():
            build_workload(WorkloadConfig(name="jsonl", path=str(tmp_path)), TOK, 512)


@pytest.mark.parametrize("name", ["azure_conv", "mooncake", "jsonl", "sharegpt"])
def test_every_workload_loader_says_its_path_is_a_directory(tmp_path, name):
    from optladder.traffic.workload import WorkloadConfig, build_workload
    from tests.test_workload import TOK

    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.csv").write_text("")
    with pytest.raises(IsADirectoryError) as e:  # relative, under the data root: found, but not a file
        build_workload(WorkloadConfig(name=name, path="traces"), TOK, 512, data_root=str(tmp_path))
    assert str(e.value).startswith(f"data file 'traces' is a directory ({tmp_path / 'traces'}), not a file")
    assert str(e.value).endswith("(it holds t.csv)") and "not found" not in str(e.value)


# Row numbers in errors. The trace formats have no row ids (a request's req-NNNNN counts the replayed window,
# after sampling and sorting), so their rows are the file's lines counted from 1, header and blank lines
# included, as an editor numbers them; a ShareGPT entry is counted from 1 too and named by its own id.
def test_azure_and_line_trace_errors_name_the_line_an_editor_shows(tmp_path):
    lines = [AZURE_HEADER.strip(), "2023-11-16 18:15:46.68,374,44", "", "2023-11-16 18:15:47,oops,1",
             "2023-11-16 18:15:48,10,1"]
    path = write(tmp_path, "az.csv", "\n".join(lines) + "\n")
    bad = next(i for i, line in enumerate(lines, 1) if "oops" in line)
    with pytest.raises(ValueError, match=rf"az\.csv:{bad}: ") as e:
        load_trace("azure", path)
    assert bad == 4 and "'oops'" in str(e.value)
    rows = [{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}, None,
            {"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": "x"},
            {"timestamp": 2, "input_length": 5, "output_length": 1, "hash_ids": [2]}]
    text = "".join("\n" if r is None else json.dumps(r) + "\n" for r in rows)  # line 2 blank
    with pytest.raises(ValueError, match=r"mc\.jsonl:3: hash_ids must be"):
        load_trace("mooncake", write(tmp_path, "mc.jsonl", text))
    text = jsonl([{"input_tokens": 3, "output_tokens": 1}]) + "\n" + jsonl([{"input_tokens": -3, "output_tokens": 1}])
    with pytest.raises(ValueError, match=r"gen\.jsonl:3: negative token count"):
        load_trace("jsonl", write(tmp_path, "gen.jsonl", text))


def test_sharegpt_errors_count_entries_from_1_and_name_the_entry_id(tmp_path):
    ok = {"from": "human", "value": "hi"}
    entries = [{"id": f"conv-{i}", "conversations": [ok] if i != 3 else [{"from": "gpt", "value": "yo"}]}
               for i in range(1, 5)]  # ids counted from 1: conv-3 is the third entry, and the bad one
    path = write(tmp_path, "sg.json", json.dumps(entries))
    with pytest.raises(ValueError) as e:
        load_trace("sharegpt", path, tokenizer=CharTokenizer())
    assert str(e.value).startswith(f"{path}:entry 3 (id 'conv-3'): no human turn in the conversation")
    entries[2].pop("id")
    with pytest.raises(ValueError, match=re.escape(f"{path}:entry 3: no human turn")):
        load_trace("sharegpt", write(tmp_path, "sg.json", json.dumps(entries)), tokenizer=CharTokenizer())


def test_resolve_data_path(tmp_path, monkeypatch):
    f = tmp_path / "traces" / "t.csv"
    f.parent.mkdir()
    f.write_text(AZURE_HEADER)
    assert resolve_data_path(str(f), "/elsewhere") == f  # absolute: the root is not used
    assert resolve_data_path("traces/t.csv", str(tmp_path)) == f
    monkeypatch.setenv("OPTLADDER_DATA", str(tmp_path))
    assert resolve_data_path("traces/t.csv", None) == f


@pytest.mark.parametrize("bad_line, why", [
    ("2023-11-16 18:15:47.1,abc,3", "ContextTokens 'abc' is not an integer"),
    ("2023-11-16 18:15:47.1,5", "expected 3 fields"),
    ("yesterday,5,3", "bad TIMESTAMP"),
    ("2023-11-16 18:15:47.1,-5,3", "negative token count"),
])
def test_bad_row_names_file_and_line_or_is_skipped(tmp_path, bad_line, why):
    good = "2023-11-16 18:15:46.0,10,2\n"
    path = write(tmp_path, "bad.csv", AZURE_HEADER + good + bad_line + "\n" + good + good)
    with pytest.raises(ValueError) as e:
        load_trace("azure", path)
    assert f"bad.csv:3: {why}" in str(e.value) and "on_bad_row=skip" in str(e.value)
    t = load_trace("azure", path, on_bad_row="skip")
    assert t.skipped == 1 and len(t.rows) == 3


def test_negative_and_malformed_jsonl_lines(tmp_path):
    path = write(tmp_path, "mc.jsonl", jsonl([{"timestamp": 0, "input_length": 5, "output_length": 1}]) +
                 "\n{not json\n" + jsonl([{"timestamp": 1, "input_length": 5, "output_length": -2}]))
    with pytest.raises(ValueError, match=r"mc\.jsonl:3: not valid JSON"):
        load_trace("mooncake", path)
    with pytest.raises(ValueError, match="only|at least 2"):  # both bad rows skipped: one left
        load_trace("mooncake", path, on_bad_row="skip")


@pytest.mark.parametrize("body, expect", [("", "no usable rows"), (AZURE_HEADER, "no usable rows"),
                                          (AZURE_HEADER + "2023-11-16 18:15:46.0,10,2\n", "1 usable row")])
def test_empty_and_one_row_traces(tmp_path, body, expect):
    path = write(tmp_path, "small.csv", body)
    with pytest.raises(ValueError, match=expect) as e:
        load_trace("azure", path)
    assert "at least 2" in str(e.value) and "small.csv" in str(e.value)


def test_out_of_order_rows_are_sorted_and_counted(tmp_path):
    stamps = [0, 5, 3, 4, 10]
    path = write(tmp_path, "mc.jsonl", jsonl([
        {"timestamp": s * 1000, "input_length": s + 1, "output_length": 1} for s in stamps]))
    t = load_trace("mooncake", path)
    assert t.reordered == 2
    assert [r.timestamp_s for r in t.rows] == [0, 3, 4, 5, 10]
    assert [r.input_len for r in t.rows] == [1, 4, 5, 6, 11]  # rows moved with their timestamps


def test_bad_arguments_list_valid_values(tmp_path):
    path = write(tmp_path, "a.csv", AZURE_HEADER)
    with pytest.raises(ValueError, match="on_bad_row='ignore'.*error, skip"):
        load_trace("azure", path, on_bad_row="ignore")
    with pytest.raises(ValueError, match="'csv' is not one of azure, mooncake, jsonl, sharegpt"):
        load_trace("csv", path)
    wrong = write(tmp_path, "w.csv", "time,in,out\n1,2,3\n")
    with pytest.raises(ValueError, match=r"w\.csv:1: header"):
        load_trace("azure", wrong)


def test_real_azure_trace():
    root = data_root(AZURE_FILE)
    if root is None:
        pytest.skip("the data root has no Azure trace")
    t = load_trace("azure", AZURE_FILE, data_root=str(root))
    assert len(t.rows) == 19366 and t.reordered == 0 and t.skipped == 0
    assert t.rows[0].timestamp_s == 0.0
    assert (len(t.rows) - 1) / t.rows[-1].timestamp_s == pytest.approx(5.53, abs=0.01)


def test_tied_timestamps_are_in_order_not_reordered(tmp_path):
    stamps = [0, 5, 5, 5, 10]
    path = write(tmp_path, "mc.jsonl", jsonl([
        {"timestamp": s * 1000, "input_length": i + 1, "output_length": 1} for i, s in enumerate(stamps)]))
    t = load_trace("mooncake", path)
    assert t.reordered == 0
    assert [r.input_len for r in t.rows] == [1, 2, 3, 4, 5]  # ties keep the file's order


@pytest.mark.parametrize("kind, row, why", [
    ("mooncake", {"input_length": 5, "output_length": 1}, "missing timestamp"),
    ("mooncake", {"timestamp": "soon", "input_length": 5, "output_length": 1}, "timestamp 'soon' is not a number"),
    ("mooncake", {"timestamp": True, "input_length": 5, "output_length": 1}, "timestamp True is not a number"),
    ("mooncake", {"timestamp": 1, "output_length": 1}, "missing input_length"),
    ("mooncake", {"timestamp": 1, "input_length": 5}, "missing output_length"),
    ("mooncake", {"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]},
     "hash_ids must be a list of integers, got [1, 'x']"),
    ("mooncake", {"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": 7},
     "hash_ids must be a list of integers, got 7"),
    ("mooncake", [1, 2], "expected a JSON object, got list"),
    ("jsonl", {"timestamp": "x", "input_tokens": 3, "output_tokens": 1}, "timestamp 'x' is not a number"),
    ("jsonl", {"prompt": 5, "output_tokens": 1}, "prompt must be text, got int"),
    ("jsonl", {"input_tokens": 3}, "needs 'output_tokens' (a count) or 'output' (text)"),
    ("jsonl", {"input_tokens": "3x", "output_tokens": 1}, "input_tokens '3x' is not an integer"),
])
def test_every_bad_row_says_what_is_wrong_with_it(tmp_path, kind, row, why):
    good = {"timestamp": 0, "input_length": 5, "output_length": 1, "input_tokens": 5, "output_tokens": 1}
    path = write(tmp_path, "t.jsonl", jsonl([good]) + json.dumps(row) + "\n" + jsonl([good, good]))
    with pytest.raises(ValueError, match=re.escape(f"t.jsonl:2: {why} (workload.on_bad_row=skip")):
        load_trace(kind, path)


def test_row_timestamps_come_from_the_row_not_a_default(tmp_path):
    path = write(tmp_path, "log.jsonl", jsonl([{"timestamp": 2.5, "input_tokens": 3, "output_tokens": 1},
                                               {"timestamp": 4.0, "input_tokens": 4, "output_tokens": 2}]))
    t = load_trace("jsonl", path)
    assert [r.timestamp_s for r in t.rows] == [0.0, 1.5] and t.has_timing
    untimed = load_trace("jsonl", write(tmp_path, "u.jsonl", jsonl([{"input_tokens": 3, "output_tokens": 1}] * 2)))
    assert [r.timestamp_s for r in untimed.rows] == [0.0, 0.0] and not untimed.has_timing
    mc = load_trace("mooncake", write(tmp_path, "m.jsonl", jsonl(
        [{"timestamp": 3000, "input_length": 3, "output_length": 1}, {"timestamp": 3500, "input_length": 1,
                                                                       "output_length": 1}])))
    assert [r.timestamp_s for r in mc.rows] == [0.0, 0.5]


@pytest.mark.parametrize("body, why", [("{", "not valid JSON"), ('{"a": 1}', "expected a JSON list of conversations, "
                                                                           "got dict")])
def test_a_sharegpt_file_that_is_not_a_list_is_refused(tmp_path, body, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        load_trace("sharegpt", write(tmp_path, "s.json", body), tokenizer=CharTokenizer())


def test_sharegpt_bad_entries_say_what_is_wrong(tmp_path):
    entries = [{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}, "text",
               {"id": "b", "conversations": [{"from": "gpt", "value": "hello"}]},
               {"id": "c", "conversations": [{"from": "human", "value": "xy"}, {"from": "gpt", "value": 5}]}]
    path = write(tmp_path, "s.json", json.dumps(entries))
    with pytest.raises(ValueError, match=re.escape("s.json:entry 2: expected an object with a 'conversations' list")):
        load_trace("sharegpt", path, tokenizer=CharTokenizer())
    t = load_trace("sharegpt", path, on_bad_row="skip", tokenizer=CharTokenizer())
    assert t.skipped == 2 and [(r.input_len, r.output_len, r.output_text) for r in t.rows] == [(2, 0, None),
                                                                                             (2, 0, None)]
    entries[1] = {"id": "b2", "conversations": [{"from": "gpt", "value": "hello"}]}
    with pytest.raises(ValueError, match=re.escape("s2.json:entry 2 (id 'b2'): no human turn in the conversation")):
        load_trace("sharegpt", write(tmp_path, "s2.json", json.dumps(entries)), tokenizer=CharTokenizer())


def test_non_ascii_text_is_read_as_utf8(tmp_path):
    p = tmp_path / "u.jsonl"
    p.write_bytes(jsonl([{"prompt": "héllo wörld", "output_tokens": 1}] * 2).encode("utf-8"))
    t = load_trace("jsonl", str(p), tokenizer=CharTokenizer())
    assert t.rows[0].prompt_text == "héllo wörld" and t.rows[0].input_len == 11
    s = tmp_path / "s.json"
    s.write_bytes(json.dumps([{"conversations": [{"from": "human", "value": "ça va"}]}] * 2,
                             ensure_ascii=False).encode("utf-8"))
    assert load_trace("sharegpt", str(s), tokenizer=CharTokenizer()).rows[0].prompt_text == "ça va"


# --- exact results of small files ---
def test_zero_lengths_are_rows_and_negatives_are_bad(tmp_path):
    path = write(tmp_path, "z.jsonl", jsonl([{"timestamp": 0, "input_tokens": 0, "output_tokens": 0},
                                             {"timestamp": 1, "input_tokens": 3, "output_tokens": 1}]))
    assert [(r.input_len, r.output_len) for r in load_trace("jsonl", path).rows] == [(0, 0), (3, 1)]


def test_too_few_rows_say_how_many_and_what_was_skipped(tmp_path):
    path = write(tmp_path, "one.jsonl", jsonl([{"input_tokens": 3, "output_tokens": 1}, {"input_tokens": -1}]))
    with pytest.raises(ValueError) as e:
        load_trace("jsonl", path, "skip")
    assert str(e.value) == f"{path}: the trace has 1 usable row (1 bad rows skipped); a workload needs at least 2"
    path = write(tmp_path, "two.jsonl", jsonl([{"input_tokens": -1}] * 2))
    with pytest.raises(ValueError) as e:
        load_trace("jsonl", path, "skip")
    assert str(e.value) == f"{path}: the trace has no usable rows (2 bad rows skipped); a workload needs at least 2"
    path = write(tmp_path, "empty.jsonl", "")
    with pytest.raises(ValueError) as e:
        load_trace("jsonl", path)
    assert str(e.value) == f"{path}: the trace has no usable rows; a workload needs at least 2"


def test_untimed_and_timed_traces_are_whole(tmp_path):
    from optladder.traffic.traces import LoadedTrace, TraceRow

    path = write(tmp_path, "u.jsonl", jsonl([{"prompt": "ab", "output_tokens": 1}, {"input_tokens": 3, "output": "xyz"}]))
    assert load_trace("jsonl", path, tokenizer=CharTokenizer()) == LoadedTrace(
        [TraceRow(0.0, 2, 1, prompt_text="ab"), TraceRow(0.0, 3, 3, output_text="xyz")], 0, 0, path,
        has_timing=False, warnings=[])
    path = write(tmp_path, "m.jsonl", jsonl([{"timestamp": 1500, "input_length": 5, "output_length": 2, "hash_ids": [7]},
                                             {"timestamp": 1000, "input_length": 4, "output_length": 1}]))
    assert load_trace("mooncake", path) == LoadedTrace(
        [TraceRow(0.0, 4, 1), TraceRow(0.5, 5, 2, hash_ids=[7])], 0, 1, path, has_timing=True, warnings=[])


def test_cut_short_azure_file_is_warned_about(tmp_path):
    from optladder.traffic.traces import _cut_short

    rows = "2023-11-16 18:15:46.5,10,2\n2023-11-16 18:15:47,11,3"
    path = write(tmp_path, "cut.csv", AZURE_HEADER + rows)
    assert load_trace("azure", path).warnings == [
        f"{path}: the last line has no line ending, so the file may have been cut short and its last row may be "
        f"incomplete; check it"]
    assert load_trace("azure", write(tmp_path, "ok.csv", AZURE_HEADER + rows + "\n")).warnings == []
    assert load_trace("azure", write(tmp_path, "crlf.csv", AZURE_HEADER + rows + "\r")).warnings == []
    mooncake = write(tmp_path, "m.jsonl", jsonl([{"timestamp": t, "input_length": 1, "output_length": 1}
                                                 for t in (0, 1)]).rstrip("\n"))
    assert load_trace("mooncake", mooncake).warnings == []  # only Azure CSVs are checked
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "nl").write_bytes(b"a\n")
    (tmp_path / "cut").write_bytes(b"a\nb")
    (tmp_path / "one").write_bytes(b"b")
    assert [_cut_short(tmp_path / n) for n in ("empty", "nl", "cut", "one")] == [False, False, True, True]


def test_azure_rows_parse_exactly_and_bad_ones_name_the_field(tmp_path):
    path = write(tmp_path, "a.csv", AZURE_HEADER.replace("\n", ",Extra\n") + "2023-11-16 18:15:46,10,2,x\n"
                 "2023-11-16 18:15:47.25,11,3,y\n")
    t = load_trace("azure", path)  # extra columns after the three are ignored
    assert [(r.timestamp_s, r.input_len, r.output_len) for r in t.rows] == [(0.0, 10, 2), (1.25, 11, 3)]
    for row, why in (("2023-11-16 18:15:46,10,x", "GeneratedTokens 'x' is not an integer"),
                     ("2023-11-16 18:15:46.5x,10,2", "bad TIMESTAMP '2023-11-16 18:15:46.5x' (want YYYY-MM-DD "
                                                     "HH:MM:SS.fffffff)")):
        path = write(tmp_path, "b.csv", AZURE_HEADER + "2023-11-16 18:15:45,1,1\n" + row + "\n")
        with pytest.raises(ValueError) as e:
            load_trace("azure", path)
        assert str(e.value) == f"{path}:3: {why} (workload.on_bad_row=skip skips such rows)"


def test_azure_timestamps_are_utc(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:  # across a daylight-saving change: local time would shift the gap by an hour
        path = write(tmp_path, "dst.csv", AZURE_HEADER + "2023-11-05 00:30:00,1,1\n2023-11-05 02:30:00,1,1\n")
        assert [r.timestamp_s for r in load_trace("azure", path).rows] == [0.0, 7200.0]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_sharegpt_turn_roles_and_counts(tmp_path):
    from optladder.traffic.traces import TraceRow

    convs = [{"conversations": ["not a turn", {"from": "user", "value": "hi"}, {"from": "assistant", "value": "yo!"}]},
             {"conversations": [{"from": "human", "value": "abc"}, {"from": "chatgpt", "value": "d"}]},
             {"conversations": [{"from": "human", "value": "q"}, {"from": "system", "value": "not a reply"}]},
             {"id": "x7", "conversations": [{"from": "gpt", "value": "no question"}]},
             {"conversations": [{"from": "gpt", "value": "none either"}]}]
    path = write(tmp_path, "s.json", json.dumps(convs))
    t = load_trace("sharegpt", path, "skip", tokenizer=CharTokenizer())
    assert t.rows == [TraceRow(0.0, 2, 3, prompt_text="hi", output_text="yo!"),
                      TraceRow(0.0, 3, 1, prompt_text="abc", output_text="d"),
                      TraceRow(0.0, 1, 0, prompt_text="q")]
    assert (t.skipped, t.has_timing) == (2, False)
    for conv, where in ((convs[3], "entry 2 (id 'x7')"), (convs[4], "entry 2")):
        path = write(tmp_path, "bad.json", json.dumps([convs[1], conv]))
        with pytest.raises(ValueError) as e:
            load_trace("sharegpt", path, tokenizer=CharTokenizer())
        assert str(e.value) == (f"{path}:{where}: no human turn in the conversation "
                                f"(workload.on_bad_row=skip skips such rows)")
    cases = ((write(tmp_path, "out.json", json.dumps([convs[1]])), "sharegpt", "output"),  # the reply is counted first
             (write(tmp_path, "in.json", json.dumps([convs[2]])), "sharegpt", "prompt"),
             (write(tmp_path, "in.jsonl", jsonl([{"prompt": "a", "output_tokens": 1}] * 2)), "jsonl", "prompt"))
    for path, kind, what in cases:
        with pytest.raises(ValueError) as e:
            load_trace(kind, path)
        assert str(e.value) == f"a row gives '{what}' as text without a token count: pass tokenizer= to count"


def test_negative_counts_as_strings_are_integers_and_refused(tmp_path):
    path = write(tmp_path, "n.csv", AZURE_HEADER + "2023-11-16 18:15:45,1,1\n2023-11-16 18:15:46,-5,1\n")
    with pytest.raises(ValueError) as e:
        load_trace("azure", path)
    assert str(e.value) == f"{path}:3: negative token count (input -5, output 1) (workload.on_bad_row=skip skips such rows)"
