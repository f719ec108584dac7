"""The reference engine: schedule() -> run() -> postprocess(), one step at a time.

The engine's switches are read here, once each, and handed down as what they decide: paged_kv as the KV
layout, flash_attn as the attention backend, cuda_graphs / fused_kernels / skinny_gemm as the decode step's
graphs and kernels, piecewise_graphs as the prompt steps' graphs, prefix_cache to the block manager,
batched_decode to the detokenizer, quant_int8 / quant_fp8 as the weights' quantization (optladder/engine/quant.py), kv_fp8
as the KV layout's format, speculative to a Speculator (drafts and their acceptance) and the scheduler's draft
slots. The scheduler takes the config itself and reads dynamic_batching and chunked_prefill (optladder/engine/scheduler.py).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil
import torch

from optladder.engine.attention import make_backend
from optladder.engine.block_manager import BlockManager, KVLayout
from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.detokenizer import Detokenizer
from optladder.engine.kv_quant import kv_fp8_bytes_per_token
from optladder.engine.loader import load_model, load_tokenizer, model_shape, resolve_device, resolve_dtype
from optladder.engine.model import DecodeKernels
from optladder.engine.model_runner import ModelRunner, kv_bytes_per_token
from optladder.engine.opts import enabled_opts
from optladder.engine.quant import linear_dims, quant_method, quantize_model, validate_quant
from optladder.engine.scheduler import Scheduler
from optladder.engine.sequence import SamplingParams, Sequence
from optladder.engine.speculative import Speculator, validate_speculative
from optladder.engine.stats import KVTimeline, StageTimers, StepStats
from optladder.engine.validation import validate_engine, validate_head_dim

GIB = float(1 << 30)


class PromptTooLong(ValueError):
    """Prompt plus requested output exceed max_model_len: rejected and counted, never truncated."""


@dataclass
class TokenEvent:
    request_id: str
    token_id: int
    text: str
    time: float  # monotonic seconds, when the token reached the host
    finished: bool
    finish_reason: str | None
    num_output_tokens: int
    num_preemptions: int = 0


class LLMEngine:
    def __init__(self, model_cfg: ModelConfig, cfg: EngineConfig):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        validate_engine(cfg, self.device.type)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        if cfg.cpu_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(cfg.cpu_threads)
        torch.manual_seed(cfg.seed)
        # everything that can be refused from the model's shape alone is refused before a weight loads
        shape = model_shape(model_cfg)
        validate_head_dim(cfg, self.device.type, shape.head_dim)
        self.quant_method = quant_method(cfg)
        validate_quant(self.quant_method, cfg.dtype, self.device, linear_dims(shape))
        if cfg.max_model_len > shape.max_position_embeddings:
            raise ValueError(f"engine.max_model_len={cfg.max_model_len} exceeds the model's "
                             f"max_position_embeddings={shape.max_position_embeddings}")
        spec = cfg.speculative  # read here: the Speculator below, and the scheduler's draft slots
        validate_speculative(spec, shape, cfg.max_model_len)
        # paged_kv is read here: contiguous KV is one max_model_len block per sequence
        self.block_size = cfg.block_size if cfg.paged_kv else cfg.max_model_len
        self.kv_fp8 = cfg.kv_fp8  # read here: the budget's bytes per token and the runner's cache format
        self.bytes_per_token = kv_fp8_bytes_per_token(shape) if self.kv_fp8 else kv_bytes_per_token(shape, self.dtype)
        if cfg.kv_cache_gb is not None:
            self._num_blocks()
        t0 = time.perf_counter()
        self.tokenizer = load_tokenizer(model_cfg)
        self.model = load_model(model_cfg, self.device, self.dtype, seed=cfg.seed)
        self.quant = quantize_model(self.model, self.quant_method)
        self._sync()
        self.load_s = time.perf_counter() - t0
        num_blocks = self._num_blocks()  # a fraction of free memory is known only once the weights are in
        self.block_manager = BlockManager(num_blocks, self.block_size, enable_prefix_cache=cfg.prefix_cache)
        self.runner = ModelRunner(
            self.model, self.device, self.dtype, KVLayout(self.block_size, num_blocks, fp8=self.kv_fp8),
            make_backend(cfg.flash_attn, self.device, shape.num_attention_heads, shape.num_key_value_heads),
            DecodeKernels(fused=cfg.fused_kernels, skinny=cfg.skinny_gemm),
            graph_max_batch=max(cfg.batch_size, cfg.max_num_seqs) if cfg.cuda_graphs else None,
            max_model_len=cfg.max_model_len,
            piecewise_max_tokens=min(cfg.max_num_batched_tokens, cfg.piecewise_max_tokens) if cfg.piecewise_graphs
            else None, plant=cfg.debug_plant)
        eos = self.tokenizer.eos_token_id
        self.scheduler = Scheduler(cfg, self.block_manager, tuple(eos if isinstance(eos, list) else [eos]),
                                   speculative=spec if spec else None)
        self.speculator = Speculator(spec, self.runner) if spec else None
        self.detokenizer = Detokenizer(self.tokenizer, batched=cfg.batched_decode)
        self.timers = StageTimers()
        self.runner.timers = self.timers
        self.step_stats = StepStats()
        self.kv_timeline = KVTimeline(self.bytes_per_token)
        self.kv_pool_bytes = num_blocks * self.block_size * self.bytes_per_token
        self._peak_rss = 0
        self._process = psutil.Process(os.getpid())  # once: building it reads /proc, every step would pay that
        self.enabled_opts = enabled_opts(cfg)
        self.start_s = time.perf_counter() - t0

    # --- setup ---
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _num_blocks(self) -> int:
        cfg = self.cfg
        if cfg.kv_cache_gb is not None:
            budget = int(cfg.kv_cache_gb * GIB)
        elif self.device.type == "cuda":
            budget = int(torch.cuda.mem_get_info(self.device)[0] * cfg.kv_cache_memory_fraction)
        else:
            budget = int(psutil.virtual_memory().available * cfg.kv_cache_memory_fraction)
        num_blocks = budget // (self.block_size * self.bytes_per_token)
        need = -(-cfg.max_model_len // self.block_size)
        if num_blocks < need:
            min_gb = need * self.block_size * self.bytes_per_token / GIB
            raise ValueError(f"engine.kv_cache_gb: a budget of {budget / GIB:.3f} GiB holds {num_blocks} blocks of "
                             f"{self.block_size} tokens, fewer than one max_model_len={cfg.max_model_len} sequence "
                             f"needs ({need}); give at least {min_gb:.3f} GiB or lower engine.max_model_len")
        return num_blocks

    # --- requests ---
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> Sequence:
        total = len(prompt_token_ids) + params.max_tokens
        if not prompt_token_ids or total > self.cfg.max_model_len:
            raise PromptTooLong(f"request {request_id}: {len(prompt_token_ids)} prompt + {params.max_tokens} output "
                                f"tokens exceed engine.max_model_len={self.cfg.max_model_len}")
        t0 = time.perf_counter()
        seq = Sequence(request_id, prompt_token_ids, params,
                       time.monotonic() if arrival_time is None else arrival_time)
        self.scheduler.add(seq)
        self.timers.add("schedule", time.perf_counter() - t0)
        return seq

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now (its client left): its KV blocks go back to the pool before the next step.
        Call it from the thread that steps the engine. False if the request is unknown or already done."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return False
        self.runner.release(seq)
        if self.speculator is not None:
            self.speculator.release(seq)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def next_deadline(self) -> float | None:
        return self.scheduler.next_deadline()

    # --- the loop ---
    def step(self) -> list[TokenEvent]:
        t = self.timers
        with t.time("schedule"):
            batch = self.scheduler.schedule(time.monotonic())
        if batch is None:
            return []
        if self.speculator is not None and any(batch.lookahead):
            with t.time("draft", self._sync):
                self.speculator.propose(batch)
        decode_tokens = batch.num_decode_tokens
        prefill_tokens = batch.num_tokens - decode_tokens
        stage = "decode" if not prefill_tokens else "prefill" if not decode_tokens else "mixed"
        if stage == "decode" and batch.has_drafts:
            stage = "verify"
        t0 = time.perf_counter()
        with t.time(stage, self._sync):
            logits = self.runner.forward(batch)
        self.step_stats.record(prefill_tokens, decode_tokens, time.perf_counter() - t0,
                               self.scheduler.decodes_waiting)
        sampled, drafts = batch.sampled_seqs, batch.sampled_drafts
        with t.time("sample"):
            token_ids = self.detokenizer.to_host(self.runner.sample(logits, sampled, drafts))
            if self.speculator is not None:
                token_ids = self.speculator.accept(drafts, token_ids)
            top = top_logprobs(logits, sampled, drafts)
        now = time.monotonic()
        before = [len(s) for s in sampled]
        finished = {s.seq_id for s in self.scheduler.postprocess(batch, token_ids)}
        if top is not None:  # each token appended this step keeps the distribution it was chosen from
            for seq, n, rows in zip(sampled, before, top):
                if rows is not None:
                    seq.top_logprobs += rows[:len(seq) - n]
        with t.time("detokenize"):
            texts = self.detokenizer.update(sampled)
        events = []
        for seq, n, text in zip(sampled, before, texts):
            done = seq.seq_id in finished
            if done:
                self.runner.release(seq)
                if self.speculator is not None:
                    self.speculator.release(seq)
            # one event per token; a step that emitted several (accepted drafts) puts its text on the last
            for i in range(n, len(seq)):
                last = i == len(seq) - 1
                events.append(TokenEvent(seq.request_id, seq.token_ids[i], text if last else "", now, done and last,
                                         seq.finish_reason if last else None, i + 1 - seq.num_prompt_tokens,
                                         seq.num_preemptions))
        self._record_memory(now)
        return events

    def _record_memory(self, now: float) -> None:
        bm = self.block_manager
        self.kv_timeline.record(now, bm.reserved_tokens, bm.used_tokens)
        if self.device.type == "cpu":
            self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 progress=None) -> list[Sequence]:
        """Offline: run every prompt to completion; outputs in prompt order."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        seqs = [self.add_request(f"gen-{i}", p, sp, arrival_time=0.0)
                for i, (p, sp) in enumerate(zip(prompts, params_list))]
        while self.has_unfinished():
            for ev in self.step():
                if ev.finished and progress is not None:
                    progress.update(1)
        return seqs

    def score(self, token_ids_list: list[list[int]], starts: list[int], on_device: bool = False) -> list[torch.Tensor]:
        """Teacher forcing, between requests: for each sequence the log-probs [len - start, vocab] (float32,
        on the host, or on_device) of its tokens start .. len-1, each given the tokens before it (optladder/engine/scoring.py)."""
        from optladder.engine.scoring import score_sequences

        return score_sequences(self, token_ids_list, starts, on_device)

    # --- measurements ---
    def reset_stats(self) -> None:
        self.timers.reset()
        self.step_stats.reset()
        self.kv_timeline.reset()
        self._peak_rss = 0
        # the counters too: a warm-up's preemptions, prefix hits and batch sizes are not the replay's
        sched, bm, det = self.scheduler, self.block_manager, self.detokenizer
        sched.num_preemptions, sched.batch_sizes_seen, sched.prompts_split = 0, {}, 0
        bm.blocks_allocated_total = bm.prefix_queries = bm.prefix_hits = 0
        det.host_copies = det.decode_calls = 0
        if self.speculator is not None:
            self.speculator.reset()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def memory_metrics(self) -> dict[str, float]:
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = self._peak_rss or self._process.memory_info().rss
        out = {"perf/peak_mem_gb": peak / GIB, "perf/kv_pool_gb": self.kv_pool_bytes / GIB}
        out.update(self.kv_timeline.metrics())
        return out

    def stage_metrics(self) -> dict[str, float]:
        m = {**self.timers.metrics(), **self.step_stats.metrics()}
        m["perf/preemptions"] = float(self.scheduler.num_preemptions)
        bm = self.block_manager
        if bm.prefix_queries:
            m["perf/prefix_hit_rate"] = bm.prefix_hits / bm.prefix_queries
        if self.speculator is not None:
            m.update(self.speculator.metrics())
        return m

    def opts_effective(self) -> dict[str, dict]:
        """Per opt: whether it was really in effect, and the evidence."""
        bm, sched, det, runner, st = self.block_manager, self.scheduler, self.detokenizer, self.runner, self.step_stats
        on = set(self.enabled_opts)
        steps = max(1, sum(sched.batch_sizes_seen.values()))
        graphs = runner.graphs.evidence() if runner.graphs else {"on": False}
        attn = runner.model.attn
        return {
            "paged_kv": {"on": "paged_kv" in on, "block_size": self.block_size, "num_blocks": bm.num_blocks,
                         "blocks_allocated": bm.blocks_allocated_total},
            "flash_attn": {"on": "flash_attn" in on, "backend": runner.attention_backend,
                           "varlen_kernel_steps": getattr(attn, "varlen_steps", 0)},
            "dynamic_batching": {"on": "dynamic_batching" in on,
                                 "batch_sizes_seen": dict(sorted(sched.batch_sizes_seen.items())),
                                 "preemptions": sched.num_preemptions},
            "batched_decode": {"on": "batched_decode" in on, "host_copies_per_step": det.host_copies / steps,
                               "decode_calls_per_step": det.decode_calls / steps},
            "cuda_graphs": graphs,
            "piecewise_graphs": runner.piecewise.evidence() if runner.piecewise else {"on": False},
            "fused_kernels": {"on": runner.kernels.fused, "eager_decode_steps": runner.eager_decode_steps,
                              "in_graphs": graphs.get("fused_kernels", False)},
            "skinny_gemm": {"on": runner.kernels.skinny, "in_graphs": graphs.get("skinny_gemm", False)},
            "prefix_cache": {"on": "prefix_cache" in on, "hits": bm.prefix_hits, "queries": bm.prefix_queries},
            "chunked_prefill": {"on": sched.mode == "chunked", "steps": st.steps, "mixed_steps": st.mixed_steps,
                                "prompts_split": sched.prompts_split,
                                "prefill_tokens_per_step": round(st.prefill_tokens / max(1, st.steps), 1),
                                "decode_tokens_per_step": round(st.decode_tokens / max(1, st.steps), 1),
                                "decode_stall_s": round(st.stall_s, 3)},
            "quant_int8": {**self.quant.evidence(), "on": self.quant.method == "int8"},
            "quant_fp8": {**self.quant.evidence(), "on": self.quant.method == "fp8"},
            "kv_fp8": {"on": self.kv_fp8, "kv_bytes_per_token": self.bytes_per_token,
                       "model_dtype_kv_bytes_per_token": kv_bytes_per_token(self.model.shape, self.dtype),
                       "decode_attention": runner.attention_backend},
            "speculative": self.speculator.evidence() if self.speculator is not None else {"on": False},
        }


def top_logprobs(logits: torch.Tensor, seqs: list[Sequence],
                 drafts: list[list[int]] | None) -> list[list[tuple[list[int], list[float]]] | None] | None:
    """For each sampled sequence that asked for logprobs (SamplingParams.logprobs = k), its rows' top-k (ids,
    log-probs), one row per token it may append this step (its newest token's, then one per draft); None for
    the others, and None in all when none asked (the common case: one pass over the batch, nothing computed)."""
    if not any(s.params.logprobs for s in seqs):
        return None
    out: list = []
    row = 0
    for i, seq in enumerate(seqs):
        n = 1 + (len(drafts[i]) if drafts else 0)
        k = seq.params.logprobs
        if k:
            lp = torch.log_softmax(logits[row:row + n].float(), dim=-1)
            vals, ids = torch.topk(lp, min(k, lp.shape[-1]), dim=-1)
            out.append([(a, b) for a, b in zip(ids.tolist(), vals.tolist())])
        else:
            out.append(None)
        row += n
    return out
