"""A user's own prompt set: prompt rows, Alpaca JSON, chat JSONL; the errors a broken file gives; auto
max_new_tokens."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from optladder.engine.tokenizer import SyntheticTokenizer, chat_token_ids
from optladder.quality import PromptItem, QualityConfig, load_prompt_set
from optladder.quality.prompts import resolve_max_new_tokens

DATA = Path(os.environ.get("OPTLADDER_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def user_set(path: Path, **kw) -> list[PromptItem]:
    return load_prompt_set(QualityConfig(name="jsonl", path=str(path), **kw), None)


def test_alpaca_json_list(tmp_path):
    rows = [{"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
            {"instruction": "Name a colour.", "input": "", "output": ["Red.", "Blue."], "dataset": "colours"},
            {"id": "mine", "instruction": "Say hi.", "output": "Hi."}]
    path = tmp_path / "alpaca_data.json"
    path.write_text(json.dumps(rows, indent=2))
    items = user_set(path)
    assert items == [PromptItem("alpaca_data-00001", "Add the numbers.\n\n2 and 3", ["5"]),
                     PromptItem("alpaca_data-00002", "Name a colour.", ["Red.", "Blue."], "colours"),
                     PromptItem("mine", "Say hi.", ["Hi."])]


def test_chat_jsonl_keeps_every_turn_and_scores_the_last(tmp_path):
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
             {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]
    rows = [{"id": "c1", "messages": [*convo, {"role": "assistant", "content": "Rome."}]},
            {"id": "c2", "prompt": convo, "references": ["Rome.", "Rome is."]}]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = user_set(path)
    assert a.messages == convo and a.references == ["Rome."]
    assert b.messages == convo and b.references == ["Rome.", "Rome is."]
    assert a.prompt.splitlines()[-1] == "user: And of Italy?"
    # the whole conversation goes through the chat template, not just the last turn
    tok = SyntheticTokenizer(300)
    text = tok.decode(chat_token_ids(tok, a.chat()))
    assert "system: Be brief." in text and "assistant: Paris." in text
    assert text.endswith("user: And of Italy?\nassistant:")
    assert chat_token_ids(tok, "hi") == chat_token_ids(tok, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("text, where, needle", [
    ('{"id": "a", "prompt": "x", "references": ["y"]}\n{"id": "b", "prompt": "x" "references": ["y"]}\n',
     ":2:", "not valid JSON"),
    ('{"id": "a", "prompt": "x", "references": []}\n', ":1 (id 'a'):", "references must be"),
    ('{"id": "a", "messages": [{"role": "user", "content": "q"}]}\n', ":1 (id 'a'):", "must end with the assistant"),
    ('{"id": "a", "prompt": [{"role": "robot", "content": "q"}], "references": ["r"]}\n', ":1 (id 'a'):",
     "message 0"),
    ('{"id": "a", "prompt": "x", "references": ["y"]}\n{"id": "a", "prompt": "z", "references": ["y"]}\n',
     ":2 (id 'a'):", "duplicate id 'a'"),
    ('{"question": "x"}\n', ":1 (id 'set-00001'):", "'instruction' \\+ 'output'"),
    ('[{"instruction": "x", "output": "y"},\n {"instruction": "z", "output": }]', ":2:", "not valid JSON"),
    ('{\n  "rows": [{"instruction": "x", "output": "y"}]\n}\n', ":", "one JSON object"),
])
def test_a_broken_row_names_file_and_line(tmp_path, text, where, needle):
    path = tmp_path / "set.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle) as e:
        user_set(path)
    assert f"{path}{where}" in str(e.value)


def test_bad_rows_can_be_skipped_and_a_small_set_warns_with_both_counts(tmp_path, caplog):
    path = tmp_path / "set.jsonl"
    rows = [{"id": str(i), "prompt": f"p{i}", "references": [f"r{i}"] if i != 1 else []} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        items = user_set(path, on_bad_row="skip", num_prompts=200)
    assert [it.id for it in items] == ["0", "2", "3"]
    assert "skipped 1 bad rows" in caplog.text
    assert "3 usable prompts" in caplog.text and "num_prompts=200" in caplog.text
    assert len(user_set(path, on_bad_row="skip", num_prompts=2)) == 2


def test_quality_path_without_its_option_is_refused():
    with pytest.raises(ValueError, match="quality=jsonl quality.path=/x.jsonl"):
        QualityConfig(name="builtin", path="/x.jsonl")
    with pytest.raises(ValueError, match="quality.path=FILE"):
        QualityConfig(name="jsonl")


class WordTokenizer:
    def encode(self, text, add_special_tokens=False):
        return text.split()


def test_auto_max_new_tokens_follows_the_longest_reference_of_each_prompt():
    items = [PromptItem(str(i), "q", ["a", " ".join(["w"] * (10 * i))]) for i in range(1, 11)]  # 10..100 words
    auto = QualityConfig(max_new_tokens="auto", max_new_tokens_cap=512)
    assert resolve_max_new_tokens(auto, items, WordTokenizer()) == 91  # p90 of 10, 20, ..., 100
    capped = QualityConfig(max_new_tokens="auto", max_new_tokens_cap=50)
    assert resolve_max_new_tokens(capped, items, WordTokenizer()) == 50
    assert resolve_max_new_tokens(QualityConfig(max_new_tokens=7), items, WordTokenizer()) == 7
    with pytest.raises(ValueError, match="integer >= 1 or 'auto'"):
        QualityConfig(max_new_tokens="long")


@pytest.mark.skipif(not (DATA / "prompts").is_dir(), reason=f"no data root at {DATA}")
def test_alpaca_eval_file_as_a_user_set_matches_the_builtin_loader():
    path = DATA / "prompts" / "alpaca_eval_davinci003.json"
    with pytest.raises(ValueError, match="output must be"):  # two of its references are empty
        user_set(path, num_prompts=1000)
    mine = user_set(path, num_prompts=1000, on_bad_row="skip")
    theirs = load_prompt_set(QualityConfig(name="alpaca_eval", num_prompts=803), str(DATA))
    assert len(mine) == 803
    assert [(it.prompt, it.references) for it in mine] == [(it.prompt, it.references) for it in theirs]


def test_alpaca_errors_count_rows_as_the_ids_do(tmp_path):
    rows = [{"instruction": "Add the numbers.", "output": "5"}, {"instruction": "No answer."},
            {"instruction": "Say hi.", "output": "Hi."}]
    path = tmp_path / "alpaca_data.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=f"^{path}:entry 2 \\(id 'alpaca_data-00002'\\): "):  # the second row
        user_set(path)
    assert [it.id for it in user_set(path, on_bad_row="skip")] == ["alpaca_data-00001", "alpaca_data-00003"]


def test_rows_skipped_by_on_bad_row_skip_are_counted_for_the_run(tmp_path):
    from optladder.experiments.preflight import skipped_rows

    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "prompt": "p", "references": ["r"]}\n{"id": "b", "prompt": "p"}\n{"nope": 1}\n')
    assert skipped_rows(QualityConfig(name="jsonl", path=str(path), on_bad_row="skip")) == 2
    assert skipped_rows(QualityConfig(name="builtin")) == 0


def test_jsonl_errors_name_the_line_and_the_id_it_gets(tmp_path):
    # a blank line: the bad row is on line 4 of the file, and the third row, so its id is set-00003
    rows = ['{"prompt": "a", "references": ["b"]}', '{"prompt": "c", "references": ["d"]}', "",
            '{"prompt": "e", "references": []}', '{"prompt": "f", "references": ["g"]}']
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(ValueError) as e:
        user_set(path)
    assert str(e.value).startswith(f"{path}:4 (id 'set-00003'): references must be")
    assert [it.id for it in user_set(path, on_bad_row="skip")] == ["set-00001", "set-00002", "set-00004"]


def test_a_directory_as_quality_path_says_so(tmp_path):
    from optladder.experiments.errors import UserError, as_user_error

    (tmp_path / "mine.jsonl").write_text("")
    with pytest.raises(UserError) as e:
        with as_user_error():
            user_set(tmp_path)
    assert str(e.value) == (f"quality.path {str(tmp_path)!r} is a directory ({tmp_path}), not a file: give the "
                            f"path of the file itself (it holds mine.jsonl)")
    with pytest.raises(FileNotFoundError, match="prompt set not found"):  # nothing there is still 'not found'
        user_set(tmp_path / "nope.jsonl")
