"""One step's work: which sequences, how many tokens of each, and (speculative decoding) the drafts to verify.
Built by the scheduler, run by the model runner. No torch."""
from __future__ import annotations

from dataclasses import dataclass, field

from optladder.engine.sequence import Sequence


@dataclass
class Batch:
    """One step: each sequence computes the KV of its next `num_new_tokens` tokens (from its
    num_computed_tokens on); the ones whose tokens are then all computed get a new token sampled.
    Speculative decoding: a decode row may also carry drafts (at most lookahead[i], set by the engine's
    speculator), whose KV the step computes too and whose logits verify them."""

    seqs: list[Sequence]
    num_new_tokens: list[int]
    lookahead: list[int] | None = None  # KV slots reserved for drafts after each row's newest token
    samples: list[bool] = field(init=False)
    drafts: list[list[int]] = field(init=False)

    def __post_init__(self) -> None:
        assert len(self.seqs) == len(self.num_new_tokens) and all(n >= 1 for n in self.num_new_tokens)
        self.samples = [s.num_computed_tokens + n == len(s) for s, n in zip(self.seqs, self.num_new_tokens)]
        self.lookahead = self.lookahead or [0] * len(self.seqs)
        assert all(la == 0 or self.is_decode_row(i) for i, la in enumerate(self.lookahead))
        self.drafts = [[] for _ in self.seqs]

    @property
    def has_drafts(self) -> bool:
        return any(self.drafts)

    @property
    def num_draft_tokens(self) -> int:
        return sum(map(len, self.drafts))

    def is_decode_row(self, i: int) -> bool:
        """One token at the sequence's last position: a decode (or a one-token prompt, which is the same)."""
        return self.num_new_tokens[i] == 1 and self.samples[i]

    @property
    def is_decode(self) -> bool:
        return all(self.is_decode_row(i) for i in range(len(self.seqs)))

    @property
    def is_prefill(self) -> bool:
        return not any(self.is_decode_row(i) for i in range(len(self.seqs)))

    @property
    def num_decode_tokens(self) -> int:
        return sum(self.is_decode_row(i) for i in range(len(self.seqs)))

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def sampled_seqs(self) -> list[Sequence]:
        return [s for s, sample in zip(self.seqs, self.samples) if sample]

    @property
    def sampled_drafts(self) -> list[list[int]]:
        """The drafts of each sampled sequence, in the order of sampled_seqs."""
        return [d for d, sample in zip(self.drafts, self.samples) if sample]
