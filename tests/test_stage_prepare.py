"""The "prepare" stage: the host building each forward's inputs is timed on its own, once a forward, as a
part of that step's prefill/decode/mixed time (on a GPU the device waits meanwhile: what overlapping it would
save). Checked on the CPU's paths (eager decode, varlen prompt and mixed steps); the graph-replayed decode step
times its buffers' fill with the same context, which runs on CUDA only."""
from __future__ import annotations

import pytest
from test_engine_equivalence import model_config

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sequence import SamplingParams

BASE = dict(device="cpu", dtype="float32", max_model_len=512, kv_cache_gb=0.2, max_num_seqs=16, block_size=16)
FORWARD_STAGES = ("prefill", "decode", "mixed", "verify")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("kw", [
    pytest.param({}, id="baseline"),
    pytest.param(dict(paged_kv=True, dynamic_batching=True), id="continuous"),
    pytest.param(dict(paged_kv=True, dynamic_batching=True, chunked_prefill=True, max_num_batched_tokens=32),
                 id="chunked"),
])
def test_each_forward_times_its_preparation_within_its_step(kw):
    engine = LLMEngine(model_config("tiny"), EngineConfig(**{**BASE, **kw}))
    prompts = [[(5 * i + j) % 50 + 1 for j in range(12 + 7 * i)] for i in range(6)]
    engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    m = engine.stage_metrics()
    forwards = sum(m.get(f"stage/{s}_count", 0) for s in FORWARD_STAGES)
    assert forwards > 0 and m["stage/prepare_count"] == forwards
    spent = sum(m.get(f"stage/{s}_count", 0) * m.get(f"stage/{s}_ms_mean", 0) for s in FORWARD_STAGES)
    prepared = m["stage/prepare_count"] * m["stage/prepare_ms_mean"]
    assert 0 < prepared < spent
    if kw.get("chunked_prefill"):
        assert m.get("stage/mixed_count", 0) > 0  # prompt chunks beside running decodes: the varlen path too
