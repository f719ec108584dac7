"""Each switch is one typed field of EngineConfig read at exactly one place in the engine, and what it
decides is handed down as an object (the KV layout, the attention backend, the decode kernels), so no
module below the engine reads a switch a second time."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

from optladder.engine.opts import OPTS

ENGINE = Path(__file__).resolve().parents[1] / "optladder" / "engine"
SOURCES = {p.relative_to(ENGINE.parents[1]).as_posix(): p.read_text() for p in sorted(ENGINE.rglob("*.py"))}


# Each switch's one reader, and what it hands down. A new switch is added here, or the tests below fail.
READERS = {
    "paged_kv": "optladder/engine/llm_engine.py",  # the KV layout's block size
    "flash_attn": "optladder/engine/llm_engine.py",  # the attention backend
    "dynamic_batching": "optladder/engine/scheduler.py",  # the scheduler's mode
    "chunked_prefill": "optladder/engine/scheduler.py",
    "batched_decode": "optladder/engine/llm_engine.py",  # the detokenizer
    "cuda_graphs": "optladder/engine/llm_engine.py",  # the runner's graph batch
    "piecewise_graphs": "optladder/engine/llm_engine.py",  # the runner's piecewise token buckets
    "fused_kernels": "optladder/engine/llm_engine.py",  # DecodeKernels
    "skinny_gemm": "optladder/engine/llm_engine.py",
    "prefix_cache": "optladder/engine/llm_engine.py",  # the block manager
    "quant_int8": "optladder/engine/quant.py",  # quant_method(cfg): the weights' one quantization method
    "quant_fp8": "optladder/engine/quant.py",
    "kv_fp8": "optladder/engine/llm_engine.py",  # KVLayout.fp8 and the budget's bytes per token
    "speculative": "optladder/engine/llm_engine.py",  # the Speculator and the scheduler's draft slots
}


def _reads(pattern: re.Pattern) -> list[tuple[str, int]]:
    return [(path, text[:m.start()].count("\n") + 1) for path, text in SOURCES.items()
            for m in pattern.finditer(text)]


def test_every_switch_has_its_reader_in_the_table() -> None:
    assert sorted(READERS) == sorted(OPTS)


@pytest.mark.parametrize("opt", sorted(OPTS))
def test_each_switch_is_read_in_exactly_one_place_in_the_engine(opt: str) -> None:
    reads = _reads(re.compile(rf"\bcfg\.{OPTS[opt].field}\b"))
    assert len(reads) == 1, f"engine.{OPTS[opt].field} is read at {reads}: one branch point, one reader"
    assert reads[0][0] == READERS.get(opt), f"engine.{OPTS[opt].field} is read in {reads[0][0]}, not {READERS.get(opt)}"


def test_the_quantization_method_is_decided_once() -> None:
    # quant_method(cfg) reads both weight switches: it is called at one place, and the rest gets its answer
    calls = [r for r in _reads(re.compile(r"(?<!def )\bquant_method\(")) if r[0] != "optladder/engine/quant.py"]
    assert [path for path, _ in calls] == ["optladder/engine/llm_engine.py"], calls


def test_the_runner_and_attention_take_what_the_switches_decided_not_the_config() -> None:
    from optladder.engine.attention import make_backend
    from optladder.engine.model_runner import ModelRunner

    from optladder.engine.speculative import Speculator

    for path in ("optladder/engine/model_runner.py", "optladder/engine/attention.py", "optladder/engine/speculative.py", "optladder/engine/quant.py",
                 "optladder/engine/kv_quant.py", "optladder/engine/scoring.py", "optladder/engine/batch.py"):
        assert "EngineConfig" not in SOURCES[path], path
    assert "cfg" not in inspect.signature(ModelRunner).parameters
    assert "cfg" not in inspect.signature(Speculator).parameters  # it takes the speculative settings only
    assert list(inspect.signature(make_backend).parameters)[0] == "flash_attn"


def test_the_checker_finds_a_second_reader() -> None:
    # the check above must be able to fail: a planted second read is counted
    text = SOURCES["optladder/engine/scheduler.py"] + "\nif self.cfg.chunked_prefill:\n    pass\n"
    assert len(re.findall(r"\bcfg\.chunked_prefill\b", text)) == 2


def test_fused_decode_kernels_run_when_switched_on_and_keep_the_tokens(monkeypatch) -> None:
    """DecodeKernels(fused, skinny) reach the decode step: the fused kernels run (counted through a wrapper
    that calls the real kernel), and the greedy tokens are the eager layer's (Triton's interpreter on CPU)."""
    pytest.importorskip("triton")
    from tests.test_gpu_paths import CUDA, PROMPTS, run_decode, tiny_model

    if not CUDA and __import__("os").environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA and no Triton interpreter")
    from optladder.engine.kernels import fused
    from optladder.engine.model import DecodeKernels

    calls = []
    real = fused.add_rmsnorm
    monkeypatch.setattr(fused, "add_rmsnorm", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny_model(torch.float32)
    base, _ = run_decode(model, PROMPTS, 4, paged=True, flash=True)
    assert not calls  # off: the eager layer
    got, runner = run_decode(model, PROMPTS, 4, paged=True, flash=True, kernels=DecodeKernels(fused=True))
    assert got == base
    # 4 decode steps, each an add+RMSNorm before attention and before the MLP of every layer, and a final one
    assert runner.eager_decode_steps == 4 and len(calls) == 4 * (2 * len(model.layers) + 1)


def test_fused_kernels_serve_varlen_steps_whose_attention_reads_the_cache(monkeypatch) -> None:
    """With the Triton attention (what CUDA runs), prompt and mixed steps take the fused layer too."""
    pytest.importorskip("triton")
    from tests.test_gpu_paths import CUDA, PROMPTS, run_decode, tiny_model

    if not CUDA and __import__("os").environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA and no Triton interpreter")
    from optladder.engine.attention import FusedAttention
    from optladder.engine.kernels import fused
    from optladder.engine.model import DecodeKernels

    calls = []
    real = fused.add_rmsnorm
    monkeypatch.setattr(fused, "add_rmsnorm", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny_model(torch.float32)
    base, _ = run_decode(model, PROMPTS, 3, paged=True, flash=False)
    s = model.shape
    attn = FusedAttention(torch.device("cuda" if CUDA else "cpu"), s.num_attention_heads, s.num_key_value_heads,
                          triton=True)
    got, runner = run_decode(model, PROMPTS, 3, paged=True, flash=True, kernels=DecodeKernels(fused=True),
                             attn=attn)
    assert got == base
    assert attn.varlen_steps == 1 and len(calls) == (3 + 1) * (2 * len(model.layers) + 1)


def test_packed_puts_every_part_on_a_16_byte_boundary_in_one_copy() -> None:
    # Triton compiles a kernel per pointer alignment: views at varying offsets would recompile mid-replay
    from optladder.engine.attention import packed

    for parts in ([[1, 2, 3], [4], [5, 6]], [[7], [8, 9, 10, 11, 12], []]):
        for dtype in (torch.long, torch.int32):
            out = packed(parts, dtype, torch.device("cpu"))
            assert [t.tolist() for t in out] == parts
            assert all(t.data_ptr() % 16 == 0 for t in out)
            assert len({t.untyped_storage().data_ptr() for t in out}) == 1
