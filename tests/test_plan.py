"""The KV planner's numbers against a real engine's own accounting (bytes per token, blocks, admissions)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from optladder.engine.llm_engine import LLMEngine
from optladder.engine.loader import model_shape
from optladder.engine.sequence import SamplingParams, Sequence
from optladder.experiments.kv_plan import kv_budget, plan_kv
from optladder.experiments.plan import main as plan_main
from tests.conftest import compose_config


@pytest.fixture(scope="module")
def conf():
    return OmegaConf.to_object(compose_config(["model=tiny", "engine.kv_cache_gb=0.004", "engine.max_model_len=512"]))


def admitted(engine: LLMEngine, length: int) -> int:
    """Sequences of `length` tokens the engine's block manager takes before it refuses one."""
    bm, n = engine.block_manager, 0
    while True:
        seq = Sequence(f"s{n}", list(range(3, 3 + length)), SamplingParams(max_tokens=1))
        if not bm.can_allocate(seq):
            return n
        bm.allocate(seq)
        n += 1


@pytest.mark.parametrize("paged", [False, True])
def test_plan_matches_the_engines_kv_accounting(conf, paged):
    eng_cfg = replace(conf.engine, paged_kv=paged)
    engine = LLMEngine(conf.model, eng_cfg)
    shape = model_shape(conf.model)
    budget, _ = kv_budget(shape, torch.float32, eng_cfg.kv_cache_gb, eng_cfg.kv_cache_memory_fraction, None)
    lengths = [40, 100, 300, 500]
    plan = plan_kv(shape, torch.float32, [torch.float32], lengths, eng_cfg.max_model_len, eng_cfg.block_size,
                   budget, "")
    row = next(r for r in plan.rows if r.layout == ("paged" if paged else "contiguous"))
    assert row.bytes_per_token == engine.bytes_per_token
    assert row.num_blocks == engine.block_manager.num_blocks and row.block_size == engine.block_size
    assert row.num_blocks * row.block_size * row.bytes_per_token == engine.kv_pool_bytes
    for p, length in plan.lengths.items():
        engine.block_manager = type(engine.block_manager)(engine.block_manager.num_blocks, engine.block_size)
        assert row.concurrency[p] == admitted(engine, length), (p, length)


def test_fp8_kv_halves_bf16_and_the_gpu_budget_follows_the_engines_rule():
    shape = model_shape(OmegaConf.to_object(compose_config(["model=llama3_8b_shape"], cheap=False)).model)
    budget, rule = kv_budget(shape, torch.bfloat16, 1.0, 0.5, gpu_gb=80.0)
    assert budget == pytest.approx(0.5 * (80.0 - shape.num_params * 2 / 2**30))
    plan = plan_kv(shape, torch.bfloat16, [torch.bfloat16, torch.float8_e4m3fn], [1000, 2000, 4000], 8192, 16,
                   budget, rule)
    bf16, fp8 = [r for r in plan.rows if r.layout == "paged"]
    assert bf16.bytes_per_token == 2 * 32 * 8 * 128 * 2 and fp8.bytes_per_token * 2 == bf16.bytes_per_token
    assert fp8.num_blocks in (2 * bf16.num_blocks, 2 * bf16.num_blocks + 1)
    with pytest.raises(ValueError, match="do not fit"):
        kv_budget(shape, torch.bfloat16, None, 0.5, gpu_gb=10.0)


def test_plan_command_prints_the_table_and_refuses_a_bad_model(capsys):
    assert plan_main(["model=tiny", "engine.kv_cache_gb=0.01"]) == 0
    out = capsys.readouterr().out
    assert "| float32 |" in out and "| paged |" in out and "KV budget: 0.01 GiB" in out
    assert plan_main(["model=nope"]) == 3
    assert "optladder: error:" in capsys.readouterr().err
