"""A sequence in flight: its tokens, its KV blocks, and where it stands. No torch."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import Enum, auto
from typing import Optional


class SeqStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_tokens: int = 16
    ignore_eos: bool = True  # True: exactly max_tokens tokens
    seed: Optional[int] = None
    logprobs: int = 0  # > 0: record the top-`logprobs` log-probs at every output position (Sequence.top_logprobs)

    def __post_init__(self) -> None:
        if self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class Sequence:
    _ids = itertools.count()

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float = 0.0):
        self.seq_id = next(Sequence._ids)
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.arrival_time = arrival_time
        self.status = SeqStatus.WAITING
        self.block_table: list[int] = []
        # the model runner's numpy copy of block_table: (the list it copies, entries copied, the array)
        self.block_table_np: tuple | None = None
        self.num_cached_tokens = 0  # prompt tokens whose KV came from the prefix cache
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_preemptions = 0
        self.finish_reason: Optional[str] = None
        # incremental detokenization state (optladder/engine/detokenizer.py)
        self.prefix_offset = max(self.num_prompt_tokens - 5, 0)
        self.read_offset = self.num_prompt_tokens
        self.output_text = ""
        # with params.logprobs: per output token, (top ids, their log-probs) of the distribution it was chosen from
        self.top_logprobs: list[tuple[list[int], list[float]]] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status == SeqStatus.FINISHED

    def num_blocks(self, block_size: int) -> int:
        return (len(self) + block_size - 1) // block_size

    def block_tokens(self, i: int, block_size: int) -> list[int]:
        return self.token_ids[i * block_size:(i + 1) * block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def reset_for_recompute(self) -> None:
        """Preempted: its KV is dropped; the tokens so far are recomputed as a prompt when readmitted."""
        self.status = SeqStatus.WAITING
        self.block_table, self.block_table_np = [], None
        self.num_cached_tokens = 0
        self.num_computed_tokens = 0
        self.num_preemptions += 1
