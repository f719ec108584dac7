"""Our LlamaModel against transformers' LlamaForCausalLM, float32 on the CPU: the same logits at every
position, for the prompt in one prefill and then token by token through our KV cache, so the model and
its cache paths (contiguous and paged, naive and fused attention) are proven right, not only consistent
with each other.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from optladder.engine.block_manager import BlockManager
from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.llm_engine import LLMEngine
from optladder.engine.loader import converted_dir, model_shape
from optladder.engine.model import LlamaShape
from optladder.engine.scheduler import Batch
from optladder.engine.sequence import SamplingParams, Sequence
from optladder.engine.tokenizer import chat_token_ids

CONF = Path(__file__).resolve().parents[1] / "optladder" / "conf"
PROMPTS = ("Name three primary colors and say which two make green, then explain why in one sentence.", "Hi!")
NUM_DECODE = 6
SWITCHES = {"contiguous+naive": {}, "paged+naive": dict(paged_kv=True), "contiguous+fused": dict(flash_attn=True),
            "paged+fused": dict(paged_kv=True, flash_attn=True)}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def model_config(name: str) -> ModelConfig:
    return ModelConfig(**OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml")))


def engine_for(model_cfg: ModelConfig, **switches) -> LLMEngine:
    return LLMEngine(model_cfg, EngineConfig(device="cpu", dtype="float32", max_model_len=128, kv_cache_gb=0.05,
                                             block_size=16, **switches))


def hf_config(s: LlamaShape) -> LlamaConfig:
    return LlamaConfig(vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                       num_hidden_layers=s.num_hidden_layers, num_attention_heads=s.num_attention_heads,
                       num_key_value_heads=s.num_key_value_heads, head_dim=s.head_dim, rope_theta=s.rope_theta,
                       rms_norm_eps=s.rms_norm_eps, max_position_embeddings=s.max_position_embeddings,
                       tie_word_embeddings=s.tie_word_embeddings, attn_implementation="eager")


def our_logits(engine: LLMEngine, sequences: list[list[int]], num_prompt: list[int]) -> list[torch.Tensor]:
    """Logits at every position of each sequence: the prompts together in one prefill, then one decode step
    per further token for the whole batch (so a short context is padded and masked next to a long one),
    with blocks from the engine's own block manager (so paged tables span several blocks)."""
    bm: BlockManager = engine.block_manager
    seqs = [Sequence(f"r{i}", t[:n], SamplingParams(max_tokens=len(t)))
            for i, (t, n) in enumerate(zip(sequences, num_prompt))]
    for s in seqs:
        bm.allocate(s)
    ids, pos, meta, _ = engine.runner.prepare_varlen(Batch(seqs, list(num_prompt)))
    flat = engine.model(ids, pos, meta, torch.arange(len(ids)))
    out = [list(flat.split(num_prompt))]
    # the engine's own prefill samples from the last prompt position of each sequence
    last = torch.tensor(num_prompt).cumsum(0) - 1
    close(engine.runner.forward(Batch(seqs, list(num_prompt))), flat[last])
    for s in seqs:
        s.num_computed_tokens = len(s)
    for step in range(len(sequences[0]) - num_prompt[0]):
        for s, t, n in zip(seqs, sequences, num_prompt):
            s.append_token(t[n + step])
            bm.may_append(s)
        out.append(list(engine.runner.forward(Batch(seqs, [1] * len(seqs))).split(1)))
        for s in seqs:
            s.num_computed_tokens = len(s)
    for s in seqs:
        bm.deallocate(s)
    return [torch.cat(per_seq) for per_seq in zip(*out)]


def hf_logits(hf: LlamaForCausalLM, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0].float()


def close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """float32 through a different order of operations: equal to a few units in the 4th digit."""
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def assert_same_logits(hf: LlamaForCausalLM, engine: LLMEngine) -> None:
    sequences, num_prompt = batch(engine)
    for ours, token_ids in zip(our_logits(engine, sequences, num_prompt), sequences):
        ref = hf_logits(hf, token_ids)
        assert ours.shape == ref.shape
        close(ours, ref)
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    assert engine.block_manager.all_free()


def batch(engine: LLMEngine) -> tuple[list[list[int]], list[int]]:
    """Two chat prompts of different lengths, each followed by NUM_DECODE arbitrary tokens (teacher forcing)."""
    prompts = [chat_token_ids(engine.tokenizer, p) for p in PROMPTS]
    assert len(prompts[0]) > 16 and len(prompts[0]) != len(prompts[1])  # several paged blocks, ragged batch
    gen = torch.Generator().manual_seed(0)
    extra = [torch.randint(3, engine.model.shape.vocab_size, (NUM_DECODE,), generator=gen).tolist() for _ in prompts]
    return [p + e for p, e in zip(prompts, extra)], [len(p) for p in prompts]


# --- the tiny model: HF's random weights (norms perturbed too) loaded into ours by the HF-name loader ---

@pytest.fixture(scope="module")
def tiny_hf() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = hf_config(model_shape(model_config("tiny")))
    config.initializer_range = 0.3  # weights large enough that attention, not the embeddings alone, decides
    hf = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):  # ones by default: a swapped or ignored norm would go unseen
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return hf


@pytest.mark.parametrize("switches", list(SWITCHES))
def test_tiny_model_matches_transformers(tiny_hf: LlamaForCausalLM, switches: str) -> None:
    engine = engine_for(model_config("tiny"), **SWITCHES[switches])
    engine.model.load_hf_state_dict(tiny_hf.state_dict())
    assert_same_logits(tiny_hf, engine)


# --- SmolLM2: its real weights, loaded by each side from the same converted checkpoint ---

@pytest.mark.slow
def test_smollm2_matches_transformers() -> None:
    cfg = model_config("smollm2_135m")
    hf = LlamaForCausalLM.from_pretrained(converted_dir(cfg), dtype=torch.float32,
                                          attn_implementation="eager").eval()
    for switches in ("contiguous+naive", "paged+fused"):
        assert_same_logits(hf, engine_for(cfg, **SWITCHES[switches]))
