"""Tensor parallel through vLLM: engine.server.tensor_parallel_size becomes --tensor-parallel-size, refused
with the count where the GPUs are not there, and a random-weight shape (llama3_70b_shape) becomes a model
folder vLLM serves with dummy weights."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from optladder.backends import make_backend
from optladder.backends.vllm_args import build_launch, check_tensor_parallel
from optladder.backends.vllm_model import model_folder
from optladder.engine.config import EngineConfig, ModelConfig, ServerConfig
from tests.test_adapters import fake_python

ROOT = Path(__file__).resolve().parents[1]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_tensor_parallel_size_is_vllms_flag():
    cfg = EngineConfig(name="vllm", server=ServerConfig(tensor_parallel_size=2))
    launch = build_launch(cfg, "cuda", "/models/m", "m", "127.0.0.1", 8000, ["--load-format", "dummy"])
    assert flag(launch.args, "--tensor-parallel-size") == "2" and flag(launch.args, "--load-format") == "dummy"
    assert launch.args[0] == "/models/m"


def test_more_gpus_than_visible_is_refused_with_the_count():
    check_tensor_parallel(2, "cuda", visible_gpus=2)
    check_tensor_parallel(1, "cpu", visible_gpus=0)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4, but 2 GPU\(s\) are visible"):
        check_tensor_parallel(4, "cuda", visible_gpus=2)
    with pytest.raises(ValueError, match="runs on the CPU here"):
        check_tensor_parallel(2, "cpu", visible_gpus=0)
    with pytest.raises(ValueError, match="must be >= 1"):
        ServerConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="engine=vllm only"):
        make_backend(ModelConfig(), EngineConfig(name="reference", server=ServerConfig(tensor_parallel_size=2)))


def test_tp_on_a_cpu_is_refused_before_vllm_starts(tmp_path):
    from optladder.backends.vllm_server import VLLMServer

    marker = tmp_path / "started"
    py = fake_python(tmp_path, f"open({str(marker)!r}, 'w')")
    cfg = EngineConfig(name="vllm", device="cpu", block_size=128,
                       server=ServerConfig(python=py, tensor_parallel_size=2, startup_timeout_s=30))
    with pytest.raises(ValueError, match="tensor_parallel_size=2"):
        VLLMServer(ModelConfig(name="tiny", source="random", tokenizer="synthetic", vocab_size=512,
                               cache_dir=str(tmp_path)), cfg)
    assert not marker.exists()


def test_the_70b_shape_becomes_a_dummy_weight_model_folder(tmp_path):
    fields = yaml.safe_load((ROOT / "optladder/conf/model/llama3_70b_shape.yaml").read_text())
    cfg = ModelConfig(**{**fields, "cache_dir": str(tmp_path)})
    folder, args = model_folder(cfg)
    assert args == ["--load-format", "dummy"]
    c = json.loads((folder / "config.json").read_text())
    assert (c["architectures"], c["num_hidden_layers"], c["hidden_size"], c["num_key_value_heads"]) == \
        (["LlamaForCausalLM"], 80, 8192, 8)
    from optladder.engine.loader import model_shape

    assert 70e9 < model_shape(cfg).num_params < 71e9  # 141 GB in bf16: more than one H200 holds
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert len(tok) == c["vocab_size"] == 128256  # vLLM can detokenize every id a random model samples
    assert tok.decode([128255]) == "w128255" and tok.eos_token_id == c["eos_token_id"]
    assert model_folder(cfg)[0] == folder  # written once, reused
