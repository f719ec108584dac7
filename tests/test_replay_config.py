"""The replay settings (the config's `replay` group) and the pacing beside them: every bad value refused
with the key that holds it, the value and what would be valid; the edges of every range allowed."""
from __future__ import annotations

import re

import pytest

from optladder.traffic.replay_config import Pacing, ReplayConfig


@pytest.mark.parametrize("kwargs, message", [
    ({"driver": "grpc"}, "replay.driver='grpc' is not one of ['inprocess', 'locust']"),
    ({"endpoint": "embeddings"}, "replay.endpoint='embeddings' is not one of ['completions', 'chat']"),
    ({"capacity_mode": "qps"}, "replay.capacity_mode='qps' is not one of ['concurrency', 'rate']"),
    ({"warmup_requests": -1}, "replay.warmup_requests must be >= 0, got -1"),
    ({"max_users": 0}, "replay.max_users must be >= 1, got 0"),
    ({"capacity_requests": 0}, "replay.capacity_requests must be >= 1, got 0"),
    ({"capacity_requests": 32}, "replay.capacity_requests=32 is below replay.capacity_hi=64: a closed-loop probe"),
    ({"request_timeout_s": 0}, "replay.request_timeout_s must be > 0, got 0"),
    ({"capacity_lo": 0}, "capacity needs 0 < lo <= hi, got lo=0, hi=64.0"),
    ({"capacity_hi": 0.5}, "capacity needs 0 < lo <= hi, got lo=1.0, hi=0.5"),
    ({"capacity_lo": 1.5}, "capacity mode=concurrency needs whole numbers, got lo=1.5, hi=64.0"),
    ({"capacity_iters": -1}, "capacity iters must be >= 0, got -1"),
])
def test_bad_replay_settings_name_the_key_the_value_and_the_valid_ones(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ReplayConfig(**kwargs)


def test_the_edges_are_allowed():
    ReplayConfig(warmup_requests=0, max_users=1, capacity_requests=1, request_timeout_s=0.5, capacity_iters=0,
                 capacity_lo=1.0, capacity_hi=1.0)
    ReplayConfig(capacity_mode="rate", capacity_lo=0.5, capacity_hi=0.75)
    ReplayConfig(capacity_mode="rate", capacity_requests=1, capacity_hi=100)  # a rate needs no number of requests
    assert Pacing("closed", 1).concurrency == 1


@pytest.mark.parametrize("kwargs, message", [({"mode": "poisson"}, "replay mode='poisson' is not one of "
                                                                   "['open', 'closed']"),
                                             ({"concurrency": 0}, "replay concurrency must be >= 1, got 0")])
def test_bad_pacing_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Pacing(**kwargs)
