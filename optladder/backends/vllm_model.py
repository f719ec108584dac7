"""The model folder `vllm serve` reads. Real weights: the converted checkpoint. A random-weight shape
(model.source=random, e.g. llama3_70b_shape): a folder with that shape's config.json and a tokenizer, and
vLLM's `--load-format dummy` draws the weights on the GPUs, so a 70B-shaped model needs no 140 GB download.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from optladder.engine.config import ModelConfig

PAD, BOS, EOS = 0, 1, 2  # the ids of optladder/engine/tokenizer.py's SyntheticTokenizer


def llama_config(cfg: ModelConfig) -> dict:
    """config.json of a Llama with the shape fields of a random model config."""
    head_dim = cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": head_dim, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps,
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": False, "mlp_bias": False,
            "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "torch_dtype": "bfloat16"}


def synthetic_tokenizer_files(vocab_size: int, out: Path) -> None:
    """The synthetic tokenizer's vocabulary as a Hugging Face fast tokenizer (one word per id), so vLLM can
    detokenize every id a random model samples. Text means nothing here; token counts are what matter."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    vocab.update({f"w{i}": i for i in range(259, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<pad>", "model_max_length": 1 << 20,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}"}))


def shape_dir(cfg: ModelConfig) -> Path:
    """<cache>/<name>-vllm: config.json + tokenizer, written once (atomically: parallel jobs may race)."""
    from optladder.engine.loader import cache_root, converted_dir

    out = cache_root(cfg) / f"{cfg.name}-vllm"
    config = llama_config(cfg)
    if (out / "config.json").exists():
        if json.loads((out / "config.json").read_text()) == config:
            return out
        shutil.rmtree(out)  # the shape in the config changed since it was written
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{cfg.name}-"))
    try:
        if cfg.tokenizer == "synthetic":
            synthetic_tokenizer_files(cfg.vocab_size, tmp)
        elif cfg.tokenizer == "smollm2":
            src = converted_dir(ModelConfig(cache_dir=cfg.cache_dir))  # the defaults are SmolLM2's
            for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                if (src / f).exists():
                    shutil.copy(src / f, tmp / f)
        else:
            raise ValueError(f"model {cfg.name!r} has random weights and model.tokenizer={cfg.tokenizer!r}: "
                             "vLLM needs a tokenizer, set model.tokenizer=synthetic or smollm2")
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        try:
            os.replace(tmp, out)
        except OSError:  # another job of the sweep wrote the same folder first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def model_folder(cfg: ModelConfig) -> tuple[Path, list[str]]:
    """The folder to serve and the `vllm serve` arguments it needs."""
    from optladder.engine.loader import converted_dir

    if cfg.source == "random":
        return shape_dir(cfg), ["--load-format", "dummy"]
    return converted_dir(cfg), []
