"""The "prepare" stage: the host building each forward's inputs is timed on its own, once a forward, as a
part of that step's prefill/decode/mixed time (on a GPU the device waits meanwhile: what overlapping it would
save). Checked on the CPU's paths (eager decode, varlen prompt and mixed steps, and a decode step that a graph
runner hands back to the eager path); the graph replay's own fill runs on CUDA only."""
from __future__ import annotations

import time

import pytest
from test_engine_equivalence import model_config

from optladder.engine.config import EngineConfig
from optladder.engine.llm_engine import LLMEngine
from optladder.engine.model import LlamaModel
from optladder.engine.model_runner import ModelRunner
from optladder.engine.sequence import SamplingParams

BASE = dict(device="cpu", dtype="float32", max_model_len=512, kv_cache_gb=0.2, max_num_seqs=16, block_size=16)
FORWARD_STAGES = ("prefill", "decode", "mixed", "verify")
PREP_S, MODEL_S = 0.004, 0.012  # sleeps added to the input preparation and to the model's forward

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _slowed(monkeypatch):
    """Input preparation takes PREP_S longer and the model MODEL_S longer: a prepare timer that took in the
    model, or missed the preparation, is off by far more than the timers' own noise."""
    for name in ("prepare_varlen", "prepare_decode"):
        real = getattr(ModelRunner, name)

        def slow(self, *a, _real=real, **kw):
            time.sleep(PREP_S)
            return _real(self, *a, **kw)
        monkeypatch.setattr(ModelRunner, name, slow)
    real_forward = LlamaModel.forward

    def slow_forward(self, *a, **kw):
        time.sleep(MODEL_S)
        return real_forward(self, *a, **kw)
    monkeypatch.setattr(LlamaModel, "forward", slow_forward)


class FallbackGraphs:
    """A graph runner whose batches are all too large: every decode step goes back to the eager path."""
    def __init__(self):
        self.asked = 0

    def bucket(self, n):
        self.asked += 1
        return None


@pytest.mark.parametrize("kw", [
    pytest.param({}, id="baseline"),
    pytest.param(dict(paged_kv=True, dynamic_batching=True), id="continuous"),
    pytest.param(dict(paged_kv=True, dynamic_batching=True, chunked_prefill=True, max_num_batched_tokens=32),
                 id="chunked"),
    pytest.param(dict(paged_kv=True, dynamic_batching=True, graphs="fallback"), id="graph_fallback"),
])
def test_each_forward_times_its_preparation_and_only_that(monkeypatch, kw):
    kw = dict(kw)
    graphs = kw.pop("graphs", None)
    engine = LLMEngine(model_config("tiny"), EngineConfig(**{**BASE, **kw}))
    if graphs:
        engine.runner.graphs = stub = FallbackGraphs()
    _slowed(monkeypatch)
    prompts = [[(5 * i + j) % 50 + 1 for j in range(12 + 7 * i)] for i in range(6)]
    engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    m = engine.stage_metrics()
    forwards = sum(m.get(f"stage/{s}_count", 0) for s in FORWARD_STAGES)
    assert forwards > 0 and m["stage/prepare_count"] == forwards  # once a forward, fallback or not
    mean = m["stage/prepare_ms_mean"] / 1e3
    assert PREP_S <= mean < PREP_S + MODEL_S / 2  # the preparation's sleep in it, the model's not
    if graphs:
        assert stub.asked == m["stage/decode_count"] > 0 and engine.runner.eager_decode_steps == stub.asked
    if kw.get("chunked_prefill"):
        assert m.get("stage/mixed_count", 0) > 0  # prompt chunks beside running decodes: the varlen path too
