"""A run's name and tags as built from its config and its workload: what tells runs apart, and what says the
replay departs from its trace."""
from __future__ import annotations

from optladder.experiments.build import build
from optladder.experiments.run_views import run_tags
from tests.conftest import compose_config


def _conf(*overrides):
    return build(compose_config(["tracking.enabled=false", *overrides]))


def test_a_replay_whose_lengths_changed_is_tagged():
    conf = _conf()
    clipped = {"traffic/changed_input_share": 0.39, "traffic/changed_output_share": 0.0}
    assert run_tags(conf, [], {}, clipped)["optladder.lengths_changed"] == "true"
    kept = {"traffic/changed_input_share": 0.05, "traffic/changed_output_share": 0.05}
    assert "optladder.lengths_changed" not in run_tags(conf, [], {}, kept)
    assert "optladder.lengths_changed" not in run_tags(conf, [], {})


def test_a_replay_whose_prefix_reuse_changed_is_tagged():
    conf = _conf()
    moved = {"traffic/prefix_hit_rate_trace": 0.114, "traffic/prefix_hit_rate_replayed": 0.8}
    assert run_tags(conf, [], {}, moved)["optladder.prefix_reuse_changed"] == "true"
    kept = {"traffic/prefix_hit_rate_trace": 0.5, "traffic/prefix_hit_rate_replayed": 0.54}
    assert "optladder.prefix_reuse_changed" not in run_tags(conf, [], {}, kept)


def test_runs_are_named_by_what_tells_them_apart(tmp_path):
    from optladder.experiments.run_views import run_name

    a, b = tmp_path / "mine.jsonl", tmp_path / "theirs.jsonl"
    assert run_name(_conf(), [], {}) == "reference:baseline:tiny"  # the default run: nothing more to say
    assert run_name(_conf("seed=2"), [], {}) == "reference:baseline:tiny seed=2"
    assert run_name(_conf("quality=jsonl", f"quality.path={a}"), [], {}) == "reference:baseline:tiny quality=mine"
    assert run_name(_conf("quality=jsonl", f"quality.path={b}"), [], {}) == "reference:baseline:tiny quality=theirs"
    assert run_name(_conf("quality=alpaca_eval"), [], {}) == "reference:baseline:tiny quality=alpaca_eval"
    assert run_name(_conf("workload=azure_conv"), [], {}) == "reference:baseline:tiny workload=azure_conv_2023"
    assert run_name(_conf("workload=azure_conv", "workload.path=/x/code_2024.csv"), [], {}) == \
        "reference:baseline:tiny workload=code_2024"  # the file read, not the loader's name
    assert run_name(_conf("workload.seed=5"), [], {}) == "reference:baseline:tiny workload.seed=5"
    # a swept key the name shows already is not repeated; one it does not show is added
    assert run_name(_conf("seed=1"), [], {"sweep.seed": "1"}) == "reference:baseline:tiny seed=1"
    assert run_name(_conf(), [], {"sweep.seed": "0"}) == "reference:baseline:tiny seed=0"
    assert run_name(_conf("workload=azure_conv", "workload.path=/x/b.csv"), [], {"sweep.workload.path": "/x/b.csv",
                                                                                "sweep.workload.rate": "4"}) == \
        "reference:baseline:tiny workload=b workload.rate=4"


def test_tags_name_the_files():
    conf = _conf("workload=azure_conv", "quality=jsonl", "quality.path=/data/sets/mine.jsonl")
    tags = run_tags(conf, [], {})
    assert (tags["workload"], tags["workload.file"]) == ("azure_conv", "azure_conv_2023.csv")
    assert (tags["quality"], tags["quality.file"]) == ("jsonl", "mine.jsonl")
    assert "workload.file" not in run_tags(_conf(), [], {}) and "quality.file" not in run_tags(_conf(), [], {})
