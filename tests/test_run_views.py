"""A run's name and tags as built from its config and its workload: what tells runs apart, and what says the
replay departs from its trace."""
from __future__ import annotations

from optladder.experiments.build import build
from optladder.experiments.run_views import run_tags
from tests.conftest import compose_config


def test_a_replay_whose_lengths_changed_is_tagged():
    conf = build(compose_config(["tracking.enabled=false"]))
    clipped = {"traffic/changed_input_share": 0.39, "traffic/changed_output_share": 0.0}
    assert run_tags(conf, [], {}, clipped)["optladder.lengths_changed"] == "true"
    kept = {"traffic/changed_input_share": 0.05, "traffic/changed_output_share": 0.05}
    assert "optladder.lengths_changed" not in run_tags(conf, [], {}, kept)
    assert "optladder.lengths_changed" not in run_tags(conf, [], {})


def test_a_replay_whose_prefix_reuse_changed_is_tagged():
    conf = build(compose_config(["tracking.enabled=false"]))
    moved = {"traffic/prefix_hit_rate_trace": 0.114, "traffic/prefix_hit_rate_replayed": 0.8}
    assert run_tags(conf, [], {}, moved)["optladder.prefix_reuse_changed"] == "true"
    kept = {"traffic/prefix_hit_rate_trace": 0.5, "traffic/prefix_hit_rate_replayed": 0.54}
    assert "optladder.prefix_reuse_changed" not in run_tags(conf, [], {}, kept)
