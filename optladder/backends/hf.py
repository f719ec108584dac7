"""transformers as an engine under test, in this process. The baseline is `generate` (static batching,
DynamicCache, left padding); dynamic_batching or paged_kv switch to transformers' continuous batching
(the ContinuousBatchingManager behind `generate_batch`, with its paged cache), which couples the two;
flash_attn picks attn_implementation sdpa over eager. The same step interface as the reference engine,
so the in-process replay driver replays it with the same records.
"""
from __future__ import annotations

import math
import os
import time

import psutil
import torch

from optladder.backends.hf_batching import ContinuousRunner, StaticBatcher
from optladder.backends.opt_map import ALWAYS_ON, FIXED, MAPPED, OptMapping, collect, refuse_unmapped, requested_opts
from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.sequence import SamplingParams

SUPPORTED = ("paged_kv", "flash_attn", "dynamic_batching", "batched_decode", "cuda_graphs", "prefix_cache")
GIB = float(1 << 30)


def opt_mappings(cfg: EngineConfig, device_type: str) -> list[OptMapping]:
    want = set(requested_opts(cfg))
    refuse_unmapped("hf", sorted(want), SUPPORTED)
    cb = cfg.dynamic_batching or cfg.paged_kv
    if cfg.cuda_graphs and not cb:
        raise ValueError("opt cuda_graphs on engine=hf: transformers captures graphs only in its continuous "
                         "batching; use '+opt=[dynamic_batching,cuda_graphs]'")
    coupled = "transformers couples paged KV and continuous batching: either turns both on"
    attn = "sdpa" if cfg.flash_attn else "eager"
    return [
        OptMapping("paged_kv", "paged_kv" in want, MAPPED, cb,
                   f"on: the continuous-batching paged cache (page_size=engine.block_size); off: generate with a "
                   f"DynamicCache. {coupled}", extra={"page_size": cfg.block_size} if cb else {}),
        OptMapping("dynamic_batching", "dynamic_batching" in want, MAPPED, cb,
                   f"on: ContinuousBatchingManager (generate_batch's engine); off: generate on static batches "
                   f"of engine.batch_size. {coupled}"),
        OptMapping("flash_attn", "flash_attn" in want, MAPPED, cfg.flash_attn,
                   "attn_implementation sdpa (on) or eager (off; paged|eager under continuous batching)",
                   extra={"attn_implementation": ("paged|eager" if cb else "eager") if not cfg.flash_attn else attn}),
        OptMapping("batched_decode", "batched_decode" in want, ALWAYS_ON, True,
                   "transformers copies each step's tokens to the host once for the whole batch; the adapter "
                   "detokenizes each request once, at its end"),
        OptMapping("prefix_cache", "prefix_cache" in want, MAPPED if cb else FIXED, cfg.prefix_cache and cb,
                   "ContinuousBatchingConfig.allow_block_sharing (continuous batching only)"),
        OptMapping("cuda_graphs", "cuda_graphs" in want, MAPPED if device_type == "cuda" else FIXED,
                   cfg.cuda_graphs, "ContinuousBatchingConfig.use_cuda_graph (CUDA only; off on CPU)"),
    ]


def load_hf_model(model_cfg: ModelConfig, dtype: torch.dtype, device: torch.device, attn: str, seed: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from optladder.engine.damage import damage_model, parse_damage
    from optladder.engine.loader import converted_dir, model_shape

    if model_cfg.damage:  # a bad spec is refused before a weight loads
        parse_damage(model_cfg.damage, model_shape(model_cfg).num_hidden_layers)

    if model_cfg.source == "random":  # transformers' own init: random like ours, but not the same numbers
        s = model_shape(model_cfg)
        config = LlamaConfig(vocab_size=s.vocab_size, hidden_size=s.hidden_size, head_dim=s.head_dim,
                             intermediate_size=s.intermediate_size, num_hidden_layers=s.num_hidden_layers,
                             num_attention_heads=s.num_attention_heads, num_key_value_heads=s.num_key_value_heads,
                             rope_parameters={"rope_theta": s.rope_theta, "rope_type": "default"},
                             rms_norm_eps=s.rms_norm_eps, max_position_embeddings=s.max_position_embeddings,
                             tie_word_embeddings=s.tie_word_embeddings, initializer_range=model_cfg.init_std)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    else:
        model = AutoModelForCausalLM.from_pretrained(converted_dir(model_cfg), dtype=dtype, attn_implementation=attn)
    if model_cfg.damage:
        damage_model(model.model.layers, model_cfg.damage)
    return model.to(device).eval()


class HFEngine:
    def __init__(self, model_cfg: ModelConfig, cfg: EngineConfig):
        from optladder.engine.loader import load_tokenizer, resolve_device, resolve_dtype
        from optladder.engine.validation import validate_engine

        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        validate_engine(cfg, self.device.type)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        self.mappings = opt_mappings(cfg, self.device.type)
        t0 = time.perf_counter()
        self.tokenizer = load_tokenizer(model_cfg)
        self.model = load_hf_model(model_cfg, self.dtype, self.device, "sdpa" if cfg.flash_attn else "eager", cfg.seed)
        self.load_s = time.perf_counter() - t0
        eos = self.tokenizer.eos_token_id
        self.eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_id = self.eos_ids[0] if pad is None else pad
        self.continuous = cfg.dynamic_batching or cfg.paged_kv
        self.runner = self._continuous_runner() if self.continuous else StaticBatcher(
            self.model, self.tokenizer, cfg.batch_size, cfg.batch_timeout_ms / 1000, self.eos_ids, self.pad_id)
        self.start_s = time.perf_counter() - t0
        self._peak_rss = 0

    def _continuous_runner(self) -> ContinuousRunner:
        from transformers.generation import ContinuousBatchingConfig

        cfg, mc = self.cfg, self.model.config
        num_blocks = None
        if cfg.kv_cache_gb is not None:  # a block is page_size tokens of K and V for every layer
            head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads
            per_block = (cfg.block_size * 2 * mc.num_hidden_layers * mc.num_key_value_heads * head_dim
                         * torch.tensor([], dtype=self.dtype).element_size())
            # no more than max_num_seqs full-length sequences can use: transformers sizes per-block
            # bookkeeping tensors by this number, and an unusable surplus only costs memory
            usable = cfg.max_num_seqs * math.ceil(cfg.max_model_len / cfg.block_size)
            num_blocks = max(1, min(usable, math.floor(cfg.kv_cache_gb * GIB / per_block)))
        cbc = ContinuousBatchingConfig(
            page_size=cfg.block_size, num_blocks=num_blocks, max_batch_tokens=cfg.max_num_batched_tokens,
            max_requests_per_batch=cfg.max_num_seqs, allow_block_sharing=cfg.prefix_cache,
            max_memory_percent=None if num_blocks else cfg.kv_cache_memory_fraction,
            use_cuda_graph=cfg.cuda_graphs and self.device.type == "cuda", auto_switch_to_flash=False)
        return ContinuousRunner(self.model, self.tokenizer, cbc, self.eos_ids, self.pad_id, default_max_tokens=64)

    # --- the step interface of traffic.replay.InProcessDriver ---
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        total = len(prompt_token_ids) + params.max_tokens
        if not prompt_token_ids or total > self.cfg.max_model_len:
            raise ValueError(f"request {request_id}: {len(prompt_token_ids)} prompt + {params.max_tokens} output "
                             f"tokens exceed engine.max_model_len={self.cfg.max_model_len}")
        self.runner.add_request(request_id, list(prompt_token_ids), params,
                                time.monotonic() if arrival_time is None else arrival_time)

    def step(self) -> list:
        events = self.runner.step()
        if self.device.type == "cpu" and events:
            self._peak_rss = max(self._peak_rss, psutil.Process(os.getpid()).memory_info().rss)
        return events

    def has_unfinished(self) -> bool:
        return self.runner.has_unfinished()

    def next_deadline(self) -> float | None:
        return self.runner.next_deadline()

    # --- offline ---
    def generate(self, prompts: list[list[int]], max_new_tokens: int, progress=None, with_tokens: bool = False):
        """Greedy to EOS; a prompt with no room left in max_model_len gets ''. Outputs in prompt order; with_tokens:
        (outputs, each answer's token ids, [] where there was no room)."""
        texts = [""] * len(prompts)
        tokens: list[list[int]] = [[] for _ in prompts]
        for i, p in enumerate(prompts):
            room = min(max_new_tokens, self.cfg.max_model_len - len(p))
            if room >= 1:
                self.add_request(f"gen-{i}", p, SamplingParams(temperature=0.0, max_tokens=room, ignore_eos=False), 0.0)
        while self.has_unfinished():
            for ev in self.step():
                i = int(ev.request_id.split("-")[1])
                tokens[i].append(ev.token_id)
                if ev.finished:
                    texts[i] = ev.text
                    if progress is not None:
                        progress.update(1)
        return (texts, tokens) if with_tokens else texts

    @torch.inference_mode()
    def score(self, token_ids_list: list[list[int]], starts: list[int]) -> list:
        """Teacher forcing, between requests: log-probs [len - start, vocab] (float32 numpy) of each sequence's
        tokens from start on, one forward a sequence."""
        out = []
        for ids, start in zip(token_ids_list, starts):
            logits = self.model(torch.tensor([ids], device=self.device)).logits[0, start - 1:-1]
            out.append(torch.log_softmax(logits.float(), dim=-1).cpu().numpy())
        return out

    # --- measurements ---
    def reset_stats(self) -> None:
        self._peak_rss = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def memory_metrics(self) -> dict[str, float]:
        if self.device.type == "cuda":
            return {"perf/peak_mem_gb": torch.cuda.max_memory_allocated(self.device) / GIB}
        return {"perf/peak_mem_gb": (self._peak_rss or psutil.Process(os.getpid()).memory_info().rss) / GIB}

    def opts_effective(self) -> dict[str, dict]:
        effective = collect(self.mappings)[2]
        effective["flash_attn"]["attn_implementation"] = self.model.config._attn_implementation
        if not self.continuous:
            effective["dynamic_batching"]["batch_sizes_seen"] = dict(sorted(self.runner.batch_sizes_seen.items()))
        return effective

    def close(self) -> None:
        if self.continuous:
            self.runner.close()
