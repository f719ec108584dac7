"""quality/: the built-in set, the loaders of the real sets, scoring on hand-computed cases, review HTML."""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from optladder.quality import (
    PromptItem, QualityConfig, load_prompt_set, prompts_digest, score_vs_control, score_vs_references,
    to_metrics, write_review_html,
)
from optladder.quality.prompts import BUILTIN_PATH

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("OPTLADDER_DATA") or REPO.parent / "shared" / "data")
needs_data = pytest.mark.skipif(not (DATA / "prompts").is_dir(), reason=f"no data root at {DATA}")


# --- the built-in set ---------------------------------------------------------------------------

def test_builtin_set_is_large_varied_and_well_formed():
    rows = [json.loads(line) for line in BUILTIN_PATH.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 210
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(r["prompt"].strip() and r["references"] and all(ref.strip() for ref in r["references"])
               for r in rows)
    tasks = Counter(r["task"] for r in rows)
    assert len(tasks) >= 10
    assert max(tasks.values()) <= 2 * min(tasks.values()), tasks  # roughly balanced
    # round-robin order: a small quality.num_prompts still samples many kinds
    assert len({r["task"] for r in rows[:12]}) >= 10


def test_builtin_loads_first_n_in_file_order():
    items = load_prompt_set(QualityConfig(num_prompts=200), None)
    assert len(items) == 200 and len({it.id for it in items}) == 200
    assert items[0].id == "builtin-0001" and items[0].prompt == "What is the capital of France?"
    assert "The capital of France is Paris." in items[0].references


def test_builtin_too_many_prompts_names_both_numbers():
    size = len(BUILTIN_PATH.read_text(encoding="utf-8").splitlines())
    with pytest.raises(ValueError, match=rf"num_prompts=5000.*{size}"):
        load_prompt_set(QualityConfig(num_prompts=5000), None)


@pytest.mark.parametrize("kwargs, needle", [
    ({"name": "nope"}, r"quality.name='nope'.*builtin, alpaca_eval, self_instruct, jsonl"),
    ({"num_prompts": 0}, r"quality.num_prompts must be >= 1, got 0"),
    ({"max_new_tokens": -1}, r"quality.max_new_tokens must be an integer >= 1 or 'auto', got -1"),
    ({"name": "jsonl"}, r"quality.path"),
])
def test_config_rejects_bad_values(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        QualityConfig(**kwargs)


def test_user_jsonl_set_and_duplicate_ids(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"id": "a", "prompt": "Say hi.", "references": ["Hi."]},
            {"id": "b", "prompt": "Say bye.", "references": ["Bye.", "Goodbye."], "task": "greet"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    items = load_prompt_set(QualityConfig(name="jsonl", path=str(path), num_prompts=10), None)
    assert items == [PromptItem("a", "Say hi.", ["Hi."]), PromptItem("b", "Say bye.", ["Bye.", "Goodbye."], "greet")]
    path.write_text("\n".join(json.dumps(r) for r in rows + rows[:1]))
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        load_prompt_set(QualityConfig(name="jsonl", path=str(path)), None)


def test_digest_changes_with_any_reference():
    items = load_prompt_set(QualityConfig(num_prompts=5), None)
    same = load_prompt_set(QualityConfig(num_prompts=5), None)
    assert prompts_digest(items) == prompts_digest(same)
    same[3].references = same[3].references + ["another answer"]
    assert prompts_digest(items) != prompts_digest(same)
    assert prompts_digest(items) != prompts_digest(items[:4])


# --- the real sets ------------------------------------------------------------------------------

def test_missing_data_file_names_path_and_how_to_set_root(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as err:
        load_prompt_set(QualityConfig(name="alpaca_eval"), str(tmp_path))
    msg = str(err.value)
    assert str(tmp_path / "prompts" / "alpaca_eval_davinci003.json") in msg
    assert "data.root" in msg and "OPTLADDER_DATA" in msg
    monkeypatch.delenv("OPTLADDER_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="OPTLADDER_DATA"):
        load_prompt_set(QualityConfig(name="self_instruct"), None)


@pytest.mark.parametrize("name, rel", [("alpaca_eval", "prompts/alpaca_eval_davinci003.json"),
                                       ("self_instruct", "prompts/self_instruct_user_oriented.jsonl")])
def test_a_directory_where_a_set_file_should_be_says_so(tmp_path, name, rel):
    (tmp_path / rel).mkdir(parents=True)
    with pytest.raises(IsADirectoryError) as err:
        load_prompt_set(QualityConfig(name=name), str(tmp_path))
    assert str(err.value) == (f"quality={name}'s file {rel!r} is a directory ({tmp_path / rel}), not a file: give "
                              f"the path of the file itself (it holds no files)")


def test_alpaca_eval_and_self_instruct_errors_name_the_row_by_its_id(tmp_path):
    rows = [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d"}, {"output": "no instruction"}]
    path = tmp_path / "prompts" / "alpaca_eval_davinci003.json"
    path.parent.mkdir()
    path.write_text(json.dumps(rows))
    with pytest.raises(ValueError) as err:
        load_prompt_set(QualityConfig(name="alpaca_eval", num_prompts=2), str(tmp_path))
    assert str(err.value).startswith(f"{path}:entry 3 (id 'alpaca_eval-002'): instruction must be")
    rows[2]["instruction"] = "e"
    path.write_text(json.dumps(rows))  # the id of the third row, when it is good
    assert "alpaca_eval-002" in [it.id for it in load_prompt_set(QualityConfig(name="alpaca_eval", num_prompts=3),
                                                                  str(tmp_path))]
    tasks = [{"id": f"user_oriented_task_{i}", "instruction": "x", "instances": [{"input": "", "output": "y"}]}
             for i in range(3)]
    del tasks[1]["instances"]
    path = tmp_path / "prompts" / "self_instruct_user_oriented.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    with pytest.raises(ValueError) as err:
        load_prompt_set(QualityConfig(name="self_instruct"), str(tmp_path))
    assert str(err.value).startswith(f"{path}:2 (id 'user_oriented_task_1'): not a self-instruct task")


@needs_data
def test_alpaca_eval_draws_200_deterministically_without_empty_references():
    raw = json.loads((DATA / "prompts" / "alpaca_eval_davinci003.json").read_text(encoding="utf-8"))
    a = load_prompt_set(QualityConfig(name="alpaca_eval", seed=0), str(DATA))
    assert len(a) == 200 and len({it.id for it in a}) == 200
    assert a == load_prompt_set(QualityConfig(name="alpaca_eval", seed=0), str(DATA))
    assert {it.id for it in a} != {it.id for it in load_prompt_set(QualityConfig(name="alpaca_eval", seed=1),
                                                                     str(DATA))}
    assert all(it.references[0].strip() for it in a)
    # every usable prompt drawn: the 2 empty references are still out, and one more is too many
    everything = load_prompt_set(QualityConfig(name="alpaca_eval", num_prompts=803), str(DATA))
    assert len(everything) == 803 and all(it.references[0].strip() for it in everything)
    with pytest.raises(ValueError, match="num_prompts=804.*803"):
        load_prompt_set(QualityConfig(name="alpaca_eval", num_prompts=804), str(DATA))
    for it in a:  # prompt and davinci-003 reference come from the same row; gpt4 file not used
        row = raw[int(it.id.split("-")[1])]
        assert (it.prompt, it.references) == (row["instruction"], [row["output"]])


@needs_data
def test_self_instruct_loads_252_with_instance_input_appended():
    raw = [json.loads(line) for line in (DATA / "prompts" / "self_instruct_user_oriented.jsonl").open()]
    items = load_prompt_set(QualityConfig(name="self_instruct", num_prompts=1000), str(DATA))
    assert len(items) == 252
    assert len(load_prompt_set(QualityConfig(name="self_instruct", num_prompts=10), str(DATA))) == 10
    first = raw[0]["instances"][0]
    assert items[0].prompt == raw[0]["instruction"] + "\n\n" + first["input"]
    assert items[0].references == [first["output"]]
    no_input = next(i for i, r in enumerate(raw) if not r["instances"][0]["input"].strip())
    assert items[no_input].prompt == raw[no_input]["instruction"]


# --- scoring ------------------------------------------------------------------------------------

def test_identical_outputs_score_bleu_100_and_rouge_1():
    refs = [["The capital of France is Paris."], ["Tom has 8 apples now.", "8 apples"], ["a b c d e f"]]
    s = score_vs_references([r[0] for r in refs], refs)
    assert s.bleu == pytest.approx(100.0)
    assert (s.rouge1, s.rouge2, s.rougeL) == pytest.approx((1.0, 1.0, 1.0))
    assert all(p["bleu"] == pytest.approx(100.0) for p in s.per_prompt)
    assert "nrefs:var" in s.bleu_signature and "version:" in s.bleu_signature


def test_rouge_hand_computed_and_max_over_references():
    # "the cat sat" vs "the cat sat on the mat": unigram P=3/3, R=3/6, F=2/3;
    # bigrams P=2/2, R=2/5, F=4/7; LCS 3, so ROUGE-L F=2/3. The unrelated "dog" reference must not count.
    s = score_vs_references(["the cat sat"], [["dog", "the cat sat on the mat"]])
    assert s.rouge1 == pytest.approx(2 / 3)
    assert s.rouge2 == pytest.approx(4 / 7)
    assert s.rougeL == pytest.approx(2 / 3)
    # stemmed: "cats"/"cat" and "running"/"runs" match
    assert score_vs_references(["cats running"], [["cat runs"]]).rouge1 == pytest.approx(1.0)
    # mean over prompts: a perfect prompt and the one above
    s2 = score_vs_references(["x y", "the cat sat"], [["x y"], ["the cat sat on the mat"]])
    assert s2.rouge1 == pytest.approx((1 + 2 / 3) / 2)


def test_ragged_references_are_padded_not_emptied():
    # "e" is 1 token; its only reference has 3. Padding the missing reference with "" would make the
    # closest reference length 0 and drop the brevity penalty; duplicating the reference is neutral.
    outs = ["a b c d e f", "e"]
    ragged = score_vs_references(outs, [["a b c d e f", "z"], ["e f g"]])
    dup = score_vs_references(outs, [["a b c d e f", "z"], ["e f g", "e f g"]])
    assert ragged.bleu == pytest.approx(dup.bleu)
    assert 0 < ragged.bleu < 100


def test_empty_outputs_score_zero_and_do_not_crash():
    s = score_vs_references(["", ""], [["a b c"], ["d e f g"]])
    assert s.bleu == 0.0 and s.rouge1 == 0.0 and s.per_prompt[0] == {"bleu": 0.0, "rouge1": 0.0,
                                                                      "rouge2": 0.0, "rougeL": 0.0}
    c = score_vs_control(["", "x"], ["", "y"])
    assert c.per_prompt[0] == {"exact": True, "rougeL": 1.0}


def test_exact_match_rate_uses_raw_strings():
    c = score_vs_control(["a", "b ", "", "C", "same words here"], ["a", "b", "", "c", "same words here"])
    assert c.exact_match == pytest.approx(3 / 5)
    assert [p["exact"] for p in c.per_prompt] == [True, False, True, False, True]
    identical = score_vs_control(["one two three four", "five six seven eight"],
                                 ["one two three four", "five six seven eight"])
    assert (identical.bleu, identical.rougeL, identical.exact_match) == pytest.approx((100.0, 1.0, 1.0))


def test_bleu_is_case_sensitive_against_references_and_the_control():
    """sacrebleu's default: 'Paris' and 'paris' are different tokens, so a change of case is a change."""
    refs = [["the capital of france is paris and it is large"]]
    shouted = ["THE CAPITAL OF FRANCE IS PARIS AND IT IS LARGE"]
    assert score_vs_references(refs[0], refs).bleu == pytest.approx(100.0)
    assert score_vs_references(shouted, refs).bleu < 1.0
    assert score_vs_references(shouted, refs).per_prompt[0]["bleu"] < 1.0
    assert score_vs_control(shouted, refs[0]).bleu < 1.0


def test_rouge_against_the_control_is_stemmed_like_against_references():
    """Inflections that the Porter stemmer folds ('cats'/'cat', 'running'/'run') are one word to ROUGE."""
    out, ctl = "the cats are running home", "the cat are run home"
    assert score_vs_control([out], [ctl]).rougeL == pytest.approx(1.0)
    assert score_vs_references([out], [[ctl]]).rougeL == pytest.approx(1.0)
    assert score_vs_control([out], [ctl]).exact_match == 0.0


def test_short_answers_get_sentence_bleu_on_the_ngrams_they_have():
    """One- or two-word answers have no 4-grams; sentence BLEU counts the orders they have (effective order)."""
    s = score_vs_references(["Paris", "eight apples"], [["Paris"], ["eight apples"]])
    assert [p["bleu"] for p in s.per_prompt] == pytest.approx([100.0, 100.0])


def test_rouge_against_the_control_scores_what_differs():
    c = score_vs_control(["a b c d", "same"], ["a b x y", "same"])
    assert [p["rougeL"] for p in c.per_prompt] == pytest.approx([0.5, 1.0]) and c.rougeL == pytest.approx(0.75)


def test_scoring_refuses_nothing_to_score_and_the_wrong_type():
    with pytest.raises(ValueError, match=re.escape("no outputs to score: got an empty list")):
        score_vs_references([], [])
    with pytest.raises(TypeError, match=re.escape("to_metrics takes QualityScores or ControlScores, got dict")):
        to_metrics({})


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="2 outputs but 1 references"):
        score_vs_references(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="1 outputs but 2 control_outputs"):
        score_vs_control(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="prompt 0 has no references"):
        score_vs_references(["a"], [[]])


def test_metric_names_match_design():
    ref = to_metrics(score_vs_references(["a b"], [["a b"]]))
    ctl = to_metrics(score_vs_control(["a b"], ["a b"]))
    assert set(ref) == {"quality/bleu_vs_ref", "quality/rouge1_vs_ref", "quality/rouge2_vs_ref",
                        "quality/rougeL_vs_ref"}
    assert set(ctl) == {"quality/bleu_vs_control", "quality/rougeL_vs_control", "quality/exact_match_vs_control"}
    assert ctl["quality/exact_match_vs_control"] == 1.0


# --- review export ------------------------------------------------------------------------------

def test_review_html_escapes_marks_and_puts_differences_first(tmp_path):
    items = [PromptItem(f"p{i}", f"prompt {i} <b>", [f"ref {i}"]) for i in range(4)]
    control = ["same", "<script>alert(1)</script>", "same", "old"]
    candidate = ["same", "changed & new", "same", "new"]
    path = write_review_html(tmp_path / "review.html", items, control, candidate, n=3, title="A/B <x>")
    page = path.read_text(encoding="utf-8")
    assert "<script>" not in page and "&lt;script&gt;" in page and "changed &amp; new" in page
    assert "A/B &lt;x&gt;" in page and "prompt 0 &lt;b&gt;" in page
    assert page.count('<tr class="differ">') == 2 and page.count('<tr class="same">') == 1
    assert page.index(">p1<") < page.index(">p3<") < page.index(">p0<")
    assert ">p2<" not in page  # n=3 rows only
    with pytest.raises(ValueError, match="must pair"):
        write_review_html(tmp_path / "x.html", items, control, candidate[:2])
