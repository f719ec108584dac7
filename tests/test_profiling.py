"""The profiler wrapper on a small stand-in engine: when it starts, how many steps it keeps, what it writes."""
from __future__ import annotations

import json

import torch

from optladder.backends.profiling import OPS_FILE, TRACE_FILE, ProfileConfig, ProfiledEngine


class MatmulEngine:
    """A StepEngine whose working steps run a matmul; an idle step (a batch held back) returns nothing."""

    def __init__(self):
        self.pending, self.steps = 0, 0

    def add_request(self, request_id, prompt_token_ids, params, arrival_time=None):
        self.pending += 1

    def has_unfinished(self):
        return self.pending > 0

    def next_deadline(self):
        return None

    def step(self):
        self.steps += 1
        if self.steps % 3 == 0:
            return []
        x = torch.ones(32, 32)
        return [float((x @ x).sum())]


def test_records_working_steps_after_half_the_requests(tmp_path):
    engine = MatmulEngine()
    prof = ProfiledEngine(engine, ProfileConfig(steps=4), start_after=3, out_dir=tmp_path)
    for i in range(2):
        prof.add_request(f"r{i}", [1], None)
        prof.step()
    assert prof._prof is None and prof.recorded == 0  # not before the third request
    prof.add_request("r2", [1], None)
    while not prof.done:
        prof.step()
    assert prof.recorded == 4 and engine.steps == 2 + 6  # 4 working steps and the 2 idle ones among them
    prof.step()
    assert prof.recorded == 4  # stopped: later steps run unprofiled
    names = {e.get("name") for e in json.loads((tmp_path / TRACE_FILE).read_text())["traceEvents"]}
    assert "engine_step" in names and "aten::mm" in names
    table = (tmp_path / OPS_FILE).read_text()
    assert "(4 engine steps profiled)" in table and "## step: 6 calls" in table and "| `aten::mm` | 4 |" in table


def test_a_replay_shorter_than_the_steps_still_writes_its_trace(tmp_path):
    prof = ProfiledEngine(MatmulEngine(), ProfileConfig(steps=50), start_after=1, out_dir=tmp_path)
    prof.add_request("r0", [1], None)
    prof.step()
    prof.finish()
    assert (tmp_path / TRACE_FILE).is_file() and "(1 engine steps profiled)" in (tmp_path / OPS_FILE).read_text()
