"""The two ways transformers runs a batch, each behind the step interface of the in-process replay driver
(add_request / step / has_unfinished / next_deadline), so an HF replay has the same records as ours.

StaticBatcher: `generate` on a left-padded batch with a DynamicCache, formed like the reference engine's
  static batching (batch_size requests or batch_timeout_ms, then run to completion). A streamer stamps
  every decoding step as its tokens reach the host, so TTFT and ITL are per token, not end of batch;
  the events reach the driver when the batch ends, which only delays bookkeeping, not the times.
ContinuousRunner: transformers' ContinuousBatchingManager (the engine behind `generate_batch`: paged
  cache, continuous scheduling) on its own thread, with streaming outputs and per-token timestamps.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from optladder.engine.llm_engine import TokenEvent
from optladder.engine.sequence import SamplingParams

NO_EOS = -1  # transformers' continuous batching: an eos id that never matches


@dataclass
class _Pending:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival: float


class _StepClock(BaseStreamer):
    """generate() calls put() once with the prompt, then once per step with the batch's new tokens, right
    after they were copied to the host: the moment each request's token exists for a client."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.monotonic())

    def end(self) -> None:
        pass


class _SuppressEOS(LogitsProcessor):
    """ignore_eos for some rows of a batch: their EOS logits are -inf, so they run to max_tokens."""

    def __init__(self, rows: list[int], eos_ids: list[int]):
        self.rows, self.eos_ids = torch.tensor(rows, dtype=torch.long), eos_ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[self.rows.to(scores.device)[:, None], torch.tensor(self.eos_ids, device=scores.device)] = -float("inf")
        return scores


def _events(rid: str, tokens: list[int], times: list[float], params: SamplingParams, eos_ids: list[int],
            text: str, num_before: int = 0, done: bool = True) -> list[TokenEvent]:
    """One event per token; the request's whole text rides on its last event (decoded once, at its end)."""
    out = []
    for k, (tok, t) in enumerate(zip(tokens, times)):
        n = num_before + k + 1
        last = done and k == len(tokens) - 1
        reason = ("stop" if tok in eos_ids and not params.ignore_eos else "length") if last else None
        out.append(TokenEvent(rid, tok, text if last else "", t, last, reason, n))
    return out


class StaticBatcher:
    def __init__(self, model, tokenizer, batch_size: int, batch_timeout_s: float, eos_ids: list[int], pad_id: int):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.batch_timeout_s = batch_size, batch_timeout_s
        self.eos_ids, self.pad_id = eos_ids, pad_id
        self.pending: list[_Pending] = []
        self.batch_sizes_seen: dict[int, int] = {}

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams, arrival: float) -> None:
        self.pending.append(_Pending(request_id, prompt, params, arrival))

    def has_unfinished(self) -> bool:
        return bool(self.pending)

    def next_deadline(self) -> float | None:
        if not self.pending or len(self.pending) >= self.batch_size:
            return None
        return self.pending[0].arrival + self.batch_timeout_s

    def step(self) -> list[TokenEvent]:
        deadline = self.next_deadline()
        if not self.pending or (deadline is not None and time.monotonic() < deadline):
            return []
        batch, self.pending = self.pending[:self.batch_size], self.pending[self.batch_size:]
        return self.run(batch)

    @torch.inference_mode()
    def run(self, batch: list[_Pending]) -> list[TokenEvent]:
        self.batch_sizes_seen[len(batch)] = self.batch_sizes_seen.get(len(batch), 0) + 1
        width = max(len(p.prompt) for p in batch)
        dev = self.model.device
        ids = torch.tensor([[self.pad_id] * (width - len(p.prompt)) + p.prompt for p in batch], device=dev)
        mask = torch.tensor([[0] * (width - len(p.prompt)) + [1] * len(p.prompt) for p in batch], device=dev)
        rows = [i for i, p in enumerate(batch) if p.params.ignore_eos]
        procs = LogitsProcessorList([_SuppressEOS(rows, self.eos_ids)] if rows else [])
        gen = GenerationConfig(do_sample=False, max_new_tokens=max(p.params.max_tokens for p in batch),
                               eos_token_id=self.eos_ids, pad_token_id=self.pad_id)
        clock = _StepClock()
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen, logits_processor=procs,
                                  streamer=clock)
        events = []
        for i, p in enumerate(batch):
            toks = self._own_tokens(out[i, width:].tolist(), p.params)
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            events += _events(p.request_id, toks, clock.times, p.params, self.eos_ids, text)
        return events

    def _own_tokens(self, row: list[int], params: SamplingParams) -> list[int]:
        """This request's tokens of the batch's output: up to its own max_tokens, or its EOS, inclusive."""
        row = row[:params.max_tokens]
        if not params.ignore_eos:
            for k, tok in enumerate(row):
                if tok in self.eos_ids:
                    return row[:k + 1]
        return row


class ContinuousRunner:
    def __init__(self, model, tokenizer, cb_config, eos_ids: list[int], pad_id: int, default_max_tokens: int):
        self.tokenizer, self.eos_ids = tokenizer, eos_ids
        gen = GenerationConfig(do_sample=False, max_new_tokens=default_max_tokens, eos_token_id=eos_ids[0],
                               pad_token_id=pad_id)
        self.manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb_config)
        self.manager.start()
        self.open: dict[str, tuple[SamplingParams, int]] = {}  # request -> (params, tokens seen)
        # its timestamps are perf_counter(); the driver's clock is monotonic()
        self.offset = time.monotonic() - time.perf_counter()

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams, arrival: float) -> None:
        self.open[request_id] = (params, 0)
        self.manager.add_request(prompt, request_id=request_id, max_new_tokens=params.max_tokens, streaming=True,
                                 record_timestamps=True, eos_token_id=NO_EOS if params.ignore_eos else self.eos_ids)

    def has_unfinished(self) -> bool:
        return bool(self.open)

    def next_deadline(self) -> float | None:
        return None

    def step(self, wait_s: float = 0.002) -> list[TokenEvent]:
        """Whatever the manager's thread produced since the last call; waits up to wait_s for the first."""
        events, result = [], self.manager.get_result(timeout=wait_s)
        while result is not None:
            events += self._convert(result)
            result = self.manager.get_result(timeout=0)
        return events

    def _convert(self, result) -> list[TokenEvent]:
        rid = result.request_id
        if rid not in self.open:
            return []
        if result.error:
            raise RuntimeError(f"transformers continuous batching failed request {rid}: {result.error}")
        params, seen = self.open[rid]
        new = result.generated_tokens[seen:]
        times = [t + self.offset for t in (result.timestamps or [])[seen:seen + len(new)]]
        times += [time.monotonic()] * (len(new) - len(times))
        done = result.is_finished()
        text = self.tokenizer.decode(result.generated_tokens, skip_special_tokens=True) if done else ""
        if done:
            del self.open[rid]
        else:
            self.open[rid] = (params, seen + len(new))
        return _events(rid, new, times, params, self.eos_ids, text, num_before=seen, done=done)

    def close(self) -> None:
        self.manager.stop(block=True, timeout=30)
        self.manager.destroy()
