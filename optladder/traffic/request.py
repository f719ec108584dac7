"""The two records that cross every border: a request to replay, and what happened to it.

Plain dataclasses, no torch, no I/O: the replay drivers fill `RequestRecord`s and `optladder.traffic.metrics`
turns them into the metrics of docs/design.md. Times are seconds on a monotonic clock, relative to the
start of the replay.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass
class Request:
    """One request of a workload: what to send and when."""

    id: str
    prompt_token_ids: list[int]
    output_len: int  # exact number of tokens to generate (ignore_eos) or the cap
    scheduled_at: float = 0.0  # seconds after the replay's start; open loop only
    prompt: str | None = None  # the text the token ids were built from, where there is one
    ignore_eos: bool = True
    prefix_group: str | None = None  # requests sharing a prompt prefix (traces with hash ids)

    def __post_init__(self) -> None:
        if self.output_len < 1:
            raise ValueError(f"request {self.id}: output_len must be >= 1, got {self.output_len}")
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.id}: empty prompt")

    @property
    def input_len(self) -> int:
        return len(self.prompt_token_ids)


class StopReplay(Exception):
    """Raised by an on_record callback: the replay's outcome is decided, stop it now. The in-process driver
    aborts the requests still in flight (the engine's abort_request) and returns every unfinished one failed,
    its error "stopped: <reason>"; an engine without abort_request is replayed to the end instead."""


STOPPED = "stopped: "  # a RequestRecord.error's prefix: the replay was stopped before it finished (optladder/traffic/replay.py)


@dataclass
class RequestRecord:
    """What one request did. Filled by a driver as tokens arrive; appended to requests.jsonl at the end."""

    id: str
    scheduled_at: float
    input_tokens: int
    requested_output_tokens: int
    sent_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    output_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    ok: bool = False
    error: str | None = None
    output_text: str = ""
    preemptions: int = 0

    # --- the metric definitions of docs/design.md, in one place ---
    @property
    def ttft(self) -> float | None:
        if self.first_token_at is None or self.sent_at is None:
            return None
        return self.first_token_at - self.sent_at

    @property
    def e2e(self) -> float | None:
        if self.finished_at is None or self.sent_at is None:
            return None
        return self.finished_at - self.sent_at

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or self.e2e is None or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def lateness(self) -> float | None:
        return None if self.sent_at is None else self.sent_at - self.scheduled_at

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "RequestRecord":
        return cls(**d)


def requests_digest(requests: list[Request]) -> str:
    """sha256 over what a replay sends (ids, token ids, output lengths, schedule): two arms of an A/B
    replayed the same traffic iff their digests match."""
    h = hashlib.sha256()
    for r in requests:
        h.update(json.dumps([r.id, r.prompt_token_ids, r.output_len, round(r.scheduled_at, 6),
                             r.ignore_eos]).encode())
    return h.hexdigest()
