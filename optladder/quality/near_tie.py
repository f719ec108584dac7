"""The lossless check that works in half precision: where two arms' greedy answers part, was it a near-tie?

In bfloat16 a lossless switch (another attention kernel, another batch shape, a scheduler change) still rounds
differently, so where the top two tokens were nearly tied the greedy choice can flip, and the rest of the answer
follows the flip. Comparing the text then cannot tell a rounding flip from a bug. This check judges the fork
instead (as vLLM's own engine comparisons in bf16 do): each arm records, at every output position of its greedy
answer, the top-k log-probs of the distribution it chose from (its own decode path: batches, chunks, graphs,
drafts). At the first position where the two answers differ, the candidate's token must be within the
control's top-k there and within `margin` nats of the control's top token, and the control's token likewise
under the candidate's distribution. After the fork nothing is compared: the two answers continue from different
prefixes. Answers that never part are equal. A bug that moves the distribution far puts the chosen token far
below the other arm's top (or outside its top-k) at its first fork; a bug that moves it by little forks at
near-ties like rounding does (a rotary position off by one in later prompt chunks, on SmolLM2: every fork within
0.5 nats), and only the drift before the forks shows it, in float32 (gate.near_tie_max_drift_float32).

Plain data, no torch: `GreedyTrace` is what an engine's traced generation returns (optladder/backends/engines.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

Token = Union[int, str]  # token ids where the engine gives them; token strings from a plain OpenAI endpoint


@dataclass
class GreedyTrace:
    """One greedy answer: its tokens and, per position, the top-k (tokens, log-probs) it was chosen from."""

    tokens: list[Token]
    top: list[list[tuple[Token, float]]]

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "top": [[[t, lp] for t, lp in row] for row in self.top]}  # unrounded: a
        # margin on the bound must read the same from disk (a resumed ladder) as from memory

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GreedyTrace":
        return cls(list(d["tokens"]), [[(t, float(lp)) for t, lp in row] for row in d["top"]])


@dataclass
class Fork:
    """The first position where one prompt's answers part, and how each arm saw the other's token there."""

    prompt: int  # index in the prompt set
    prompt_id: str
    position: int  # output position (0: the first answer token)
    control_token: Token
    candidate_token: Token
    # lp(own top) - lp(other arm's token) under each arm's distribution; inf: outside its top-k
    control_margin: float
    candidate_margin: float
    near_tie: bool

    @property
    def margin(self) -> float:
        return max(self.control_margin, self.candidate_margin)

    def describe(self) -> str:
        def m(x: float) -> str:
            return f"{x:.3f}" if math.isfinite(x) else "outside the top-k"
        return (f"prompt {self.prompt_id!r} at output position {self.position}: control chose "
                f"{self.control_token!r}, candidate {self.candidate_token!r}; margin under the control "
                f"{m(self.control_margin)}, under the candidate {m(self.candidate_margin)} nats")


@dataclass
class NearTieReport:
    prompts: int
    equal: int
    forks: list[Fork]
    top_k: int
    margin: float
    unavailable: Optional[str] = None  # why no check could be made (an engine without logprobs)
    # the largest |log-prob of the chosen token, control - candidate| over positions before each fork: a
    # diagnostic of how far the distributions drift while the answers still agree (reported, not gated)
    max_drift: float = 0.0
    skipped: list[str] = field(default_factory=list)  # prompts without a trace in an arm (no room to answer)

    @property
    def diverged(self) -> int:
        return len(self.forks)

    @property
    def near_ties(self) -> int:
        return sum(f.near_tie for f in self.forks)

    @property
    def offenders(self) -> list[Fork]:
        return [f for f in self.forks if not f.near_tie]

    @property
    def worst_margin(self) -> float:
        return max((f.margin for f in self.forks), default=0.0)

    def metrics(self) -> dict[str, float]:
        if self.unavailable:
            return {}
        worst = self.worst_margin
        return {"quality/near_tie_equal": float(self.equal), "quality/near_tie_diverged": float(self.diverged),
                "quality/near_tie_not_near": float(len(self.offenders)),
                "quality/near_tie_worst_margin": worst if math.isfinite(worst) else 1e9,
                "quality/near_tie_max_drift": self.max_drift}

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst_margin
        return {"prompts": self.prompts, "equal": self.equal, "diverged": self.diverged,
                "near_ties": self.near_ties, "top_k": self.top_k, "margin": self.margin,
                "worst_margin": worst if math.isfinite(worst) else None, "max_drift": self.max_drift,
                "unavailable": self.unavailable, "skipped": self.skipped,
                "not_near_ties": [f.describe() for f in self.offenders]}


def _margin(row: list[tuple[Token, float]], token: Token) -> float:
    """lp(top) - lp(token) in one position's top-k; inf when the token is not among them."""
    if not row:
        return math.inf
    best = max(lp for _, lp in row)
    for t, lp in row:
        if t == token:
            return best - lp
    return math.inf


def compare(control: list[Optional[GreedyTrace]], candidate: list[Optional[GreedyTrace]], top_k: int, margin: float,
            prompt_ids: Optional[list[str]] = None) -> NearTieReport:
    """Judge every prompt's pair of greedy answers (in prompt order; None: the arm gave no answer there, e.g. no
    room left in max_model_len, which both arms then share). top_k: how many of the other arm's top tokens the
    chosen one must be among (at most what the traces recorded); margin: nats it may lie below their top."""
    if len(control) != len(candidate):
        raise ValueError(f"near-tie check: {len(control)} control answers but {len(candidate)} candidate answers")
    ids = prompt_ids or [str(i) for i in range(len(control))]
    equal, forks, drift, skipped = 0, [], 0.0, []
    for i, (a, b) in enumerate(zip(control, candidate)):
        if a is None or b is None:  # no room to answer: nothing to compare (in both arms alike, or said)
            if (a is None) != (b is None):
                skipped.append(ids[i])
            continue
        n = min(len(a.tokens), len(b.tokens))
        p = next((j for j in range(n) if a.tokens[j] != b.tokens[j]), None)
        for j in range(n if p is None else p):
            la, lb = _chosen(a.top[j], a.tokens[j]), _chosen(b.top[j], b.tokens[j])
            if la is not None and lb is not None:
                drift = max(drift, abs(la - lb))
        if p is None and len(a.tokens) == len(b.tokens):
            equal += 1
            continue
        if p is None:  # one answer stops where the other goes on: a length the other arm did not choose
            p = n
        ca = a.tokens[p] if p < len(a.tokens) else None
        kb = b.tokens[p] if p < len(b.tokens) else None
        cm = _margin(a.top[p][:top_k], kb) if p < len(a.top) and kb is not None else math.inf
        km = _margin(b.top[p][:top_k], ca) if p < len(b.top) and ca is not None else math.inf
        forks.append(Fork(i, ids[i], p, ca, kb, cm, km, cm <= margin and km <= margin))
    return NearTieReport(len(control), equal, forks, top_k, margin, max_drift=drift, skipped=skipped)


def _chosen(row: list[tuple[Token, float]], token: Token) -> Optional[float]:
    for t, lp in row:
        if t == token:
            return lp
    return None


def unavailable(prompts: int, top_k: int, margin: float, why: str) -> NearTieReport:
    return NearTieReport(prompts, 0, [], top_k, margin, unavailable=why)
