"""The GPU bench's parts that run on any machine: its modules import without a GPU, its report redraws the
committed H200 results exactly, and its SmolLM2 configs come from the switch registry."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from optladder.engine.opts import OPTS  # noqa: E402
from gpubench.report import markdown  # noqa: E402
from gpubench.smollm2 import FLOAT32, configs, first_divergence  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def test_every_part_imports_without_a_gpu():
    import gpubench.checks
    import gpubench.harness
    import gpubench.llama  # noqa: F401

    assert gpubench.llama.LLAMA8B.hidden_size == 4096


def test_the_report_redraws_the_committed_h200_tables():
    """gpu_h200.md is the report of gpu_h200.json plus notes written by hand after it."""
    drawn = markdown(json.loads((RESULTS / "gpu_h200.json").read_text())).splitlines()
    committed = (RESULTS / "gpu_h200.md").read_text().splitlines()
    start = committed.index(next(x for x in committed if x.startswith("## Correctness")))
    end = committed.index(next(x for x in committed if x.startswith("## Notes")))
    assert drawn[drawn.index(committed[start]):] == committed[start:end - 1]
    assert "| 4096 | 390.3 | 136.9 | 2.85× | 5.23 | 0.62 |" in drawn


def test_smollm2_configs_are_the_registrys_switches():
    cfgs = configs()
    assert cfgs["baseline"] == {} and cfgs[FLOAT32] == {"dtype": "float32"}
    lossless = {name: spec for name, spec in OPTS.items() if spec.lossless}  # greedy outputs are compared
    assert cfgs["all on"] == {spec.field: spec.on for spec in lossless.values()}
    alone = {name for name in cfgs if name not in ("baseline", "all on", FLOAT32)}
    assert {name.split("+")[-1] for name in alone} == set(lossless) and len(lossless) < len(OPTS)


@pytest.mark.parametrize("a, b, at", [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1),
                                      ([1, 2], [1, 2, 3], 2), ([], [], None)])
def test_first_divergence(a, b, at):
    assert first_divergence(a, b) == at


@pytest.mark.parametrize("paged, flash", [(True, True), (False, False)])
def test_the_bench_drives_the_engine_runner_as_the_engine_does(paged, flash):
    """The GPU bench builds runners and steps through the engine's own API: on the CPU with a tiny random
    model, a prefill step and a decode step run and the decode step's logits are the eager model's."""
    import dataclasses

    import torch

    from optladder.engine.loader import load_model
    from gpubench.llama import LLAMA8B, decode_seqs, decode_step, make_runner, prefill_step

    tiny = dataclasses.replace(LLAMA8B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    cpu = torch.device("cpu")
    model = load_model(tiny, cpu, torch.float32, seed=0)
    runner = make_runner(model, paged=paged, flash=flash, graphs=False, seqs_n=4, max_len=64, fused=False,
                         skinny=False, device=cpu, dtype=torch.float32)
    assert runner.block_size == (16 if paged else 64)
    seqs = decode_seqs(3, 20, runner, tiny.vocab_size)
    logits = runner.forward(decode_step(seqs))
    assert logits.shape == (3, tiny.vocab_size)
    assert torch.allclose(logits, model(*runner.prepare_decode(seqs)), atol=1e-5)
    assert runner.forward(prefill_step(decode_seqs(1, 30, runner, tiny.vocab_size)[0])).shape == (1, tiny.vocab_size)
