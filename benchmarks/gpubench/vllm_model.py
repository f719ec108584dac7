"""The vLLM side of the engine comparisons (gpu_vs_vllm.py, gpu_serving_vs_vllm.py): vLLM kept offline, and a
random-weight Llama folder of a shape for it to load (config.json and the tokenizer files; vLLM's
load_format=dummy fills the weights)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

OFFLINE = dict(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_USE_FLASHINFER_SAMPLER="0")


def offline_env() -> None:
    """Before vLLM is imported: no usage report, no hub, the sampler both engines compare with."""
    for k, v in OFFLINE.items():
        os.environ.setdefault(k, v)


def random_llama_dir(model_dir: Path, shape: dict, tok_dir: str | Path) -> Path:
    model_dir.mkdir(exist_ok=True)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, hidden_act="silu",
               attention_bias=False, mlp_bias=False, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
               torch_dtype="bfloat16", **shape)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tok_dir) / name, model_dir / name)
    return model_dir
