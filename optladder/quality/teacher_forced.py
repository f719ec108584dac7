"""Teacher-forced quality: both arms score the same token sequences, and their next-token distributions are
compared at every position, as llama.cpp's KL-divergence statistics judge a quantized model against its
base. Far more sensitive than BLEU on greedy text: every position of every sequence counts, not just the
few answers whose argmax flipped.

Per prompt, two sequences: the chat prompt followed by its (first) reference answer, and followed by the
control's own greedy output. At each scored position (the answer's tokens):
- KL(control ‖ candidate) of the next-token distributions, in nats;
- top-1 agreement: both arms' most likely next token is the same;
- the negative log-likelihood of the actual next token, for each arm (the reference answers' perplexity).
Results are kept per prompt (sums and counts), so optladder/abtest/teacher_forced.py can bootstrap over prompts.

Exact when both engines return the full distribution (the reference engine, engine=hf). Engines that return
only their top-k log-probs (vLLM's prompt_logprobs) give the top-1 agreement and the log-likelihoods
exactly, and an approximate KL: the distributions are compared on the control's top-k tokens plus one
bucket for the rest of the vocabulary, and a token missing from the candidate's top-k is given the
candidate's k-th log-prob. Merging the tail into one bucket can only lower the KL (the log-sum
inequality); on SmolLM2 (float32 vs bfloat16) the top-20 lumped KL was 0.90x the exact one.

The engines' log-probs come in as numpy arrays, or as torch tensors left on the GPU that computed them (the
reference engine on CUDA): then the full comparison runs there too and only its per-position numbers reach
the host. On the H200 the 8B shape's distributions (128,256 tokens at ~99,000 positions, 51 GB an arm) took
~190 s a rung pair through the host and numpy. On the CPU numpy stays: torch compared 512 x 128,256 at
0.56-0.98x numpy's speed on 2 cores.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("reference", "control_output")
ROWS = 256  # positions compared at once on a device: 256 x 128,256 tokens, ~20 bytes an element in temporaries


@dataclass
class TFSequence:
    """One teacher-forced sequence: the tokens from `start` on are scored, each given those before it."""

    prompt_index: int
    kind: str  # reference | control_output
    token_ids: list[int]
    start: int


@dataclass
class TokenLogprobs:
    """One engine's scores of one sequence, positions start .. len-1: the actual token's log-prob, and
    either the full distribution or its top-k."""

    target: np.ndarray  # [n]
    full: np.ndarray | None = None  # [n, vocab]
    topk_ids: np.ndarray | None = None  # [n, k], most likely first
    topk_logprobs: np.ndarray | None = None  # [n, k]

    @classmethod
    def from_full(cls, logprobs: np.ndarray, targets: list[int]) -> "TokenLogprobs":
        lp = np.asarray(logprobs, dtype=np.float32)
        return cls(target=lp[np.arange(len(targets)), targets], full=lp)

    @classmethod
    def from_tensor(cls, logprobs, targets: list[int]) -> "TokenLogprobs":
        """A torch tensor [n, vocab] kept on its device (compare() works there); the targets' log-probs on the host."""
        import torch

        lp = logprobs.float()
        idx = torch.as_tensor(targets, device=lp.device)
        return cls(target=lp[torch.arange(len(targets), device=lp.device), idx].cpu().numpy(), full=lp)

    def on_host(self) -> "TokenLogprobs":
        """The same scores with the full distribution as a numpy array."""
        if self.full is None or isinstance(self.full, np.ndarray):
            return self
        return TokenLogprobs(self.target, self.full.cpu().numpy(), self.topk_ids, self.topk_logprobs)

    def topk(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.full is None:
            return self.topk_ids, self.topk_logprobs
        if not isinstance(self.full, np.ndarray):
            return self.on_host().topk(k)
        ids = np.argpartition(-self.full, k - 1, axis=-1)[:, :k]
        lp = np.take_along_axis(self.full, ids, axis=-1)
        order = np.argsort(-lp, axis=-1, kind="stable")  # most likely first, as engines report them
        return np.take_along_axis(ids, order, axis=-1), np.take_along_axis(lp, order, axis=-1)


@dataclass
class PositionStats:
    kl: np.ndarray  # [n] nats
    top1_agree: np.ndarray  # [n] bool
    control_nll: np.ndarray  # [n]
    candidate_nll: np.ndarray  # [n]


@dataclass
class TeacherForcedScores:
    """Per-prompt sums over the scored positions ([P] arrays, prompt order), and every position's KL with its
    prompt index (for the p99). `approximated` says how, when an engine gave only top-k log-probs;
    `unavailable` says why nothing could be measured (then the arrays are empty)."""

    kl_sum: np.ndarray
    positions: np.ndarray  # scored positions, both sequences
    top1_agree: np.ndarray  # positions whose top-1 agreed
    ref_nll_control: np.ndarray  # over the reference answer's tokens
    ref_nll_candidate: np.ndarray
    ref_tokens: np.ndarray
    token_kl: np.ndarray  # [T]
    token_prompt: np.ndarray  # [T]
    skipped: int = 0  # sequences longer than an engine's max_model_len
    approximated: str | None = None
    unavailable: str | None = None

    @classmethod
    def not_measured(cls, reason: str) -> "TeacherForcedScores":
        empty = np.zeros(0)
        return cls(empty, empty, empty, empty, empty, empty, empty, np.zeros(0, dtype=int), unavailable=reason)

    @property
    def num_prompts(self) -> int:
        return int(self.positions.size)


class Accumulator:
    """Sums position statistics per prompt as the sequences are scored, so no distribution is kept."""

    def __init__(self, num_prompts: int):
        self.sums = {k: np.zeros(num_prompts) for k in ("kl_sum", "positions", "top1_agree", "ref_nll_control",
                                                         "ref_nll_candidate", "ref_tokens")}
        self.kl: list[np.ndarray] = []
        self.prompt: list[np.ndarray] = []

    def add(self, seq: TFSequence, stats: PositionStats) -> None:
        i, s = seq.prompt_index, self.sums
        s["kl_sum"][i] += float(stats.kl.sum())
        s["positions"][i] += stats.kl.size
        s["top1_agree"][i] += float(stats.top1_agree.sum())
        if seq.kind == "reference":
            s["ref_nll_control"][i] += float(stats.control_nll.sum())
            s["ref_nll_candidate"][i] += float(stats.candidate_nll.sum())
            s["ref_tokens"][i] += stats.kl.size
        self.kl.append(stats.kl)
        self.prompt.append(np.full(stats.kl.size, i))

    def result(self, skipped: int = 0, approximated: str | None = None) -> TeacherForcedScores:
        kl = np.concatenate(self.kl) if self.kl else np.zeros(0)
        prompt = np.concatenate(self.prompt) if self.prompt else np.zeros(0, dtype=int)
        return TeacherForcedScores(**self.sums, token_kl=kl, token_prompt=prompt, skipped=skipped,
                                   approximated=approximated)


def to_metrics(tf: TeacherForcedScores) -> dict[str, float]:
    """Point values under quality/ (docs/design.md's names); their intervals are optladder/abtest/teacher_forced.py's."""
    n, r = tf.positions.sum(), tf.ref_tokens.sum()
    if tf.unavailable or not n:
        return {}
    out = {"quality/kl_vs_control_mean": float(tf.kl_sum.sum() / n),
           "quality/kl_vs_control_p99": float(np.quantile(tf.token_kl, 0.99, method="inverted_cdf")),
           "quality/top1_agree_vs_control": float(tf.top1_agree.sum() / n),
           "quality/tf_positions": float(n)}
    if r:
        ppl_c, ppl_k = np.exp(tf.ref_nll_control.sum() / r), np.exp(tf.ref_nll_candidate.sum() / r)
        out.update({"quality/ppl_ref_control": float(ppl_c), "quality/ppl_ref_candidate": float(ppl_k),
                    "quality/ppl_ref_rel_change": float(ppl_k / ppl_c - 1.0)})
    return out


def build_sequences(prompt_ids: list[list[int]], reference_ids: list[list[int]],
                    output_ids: list[list[int]]) -> list[TFSequence]:
    """Two sequences a prompt; an empty continuation (no reference, or an empty control answer) gives none."""
    out = []
    for i, (p, r, o) in enumerate(zip(prompt_ids, reference_ids, output_ids, strict=True)):
        for kind, cont in zip(KINDS, (r, o)):
            if cont and p:
                out.append(TFSequence(i, kind, list(p) + list(cont), len(p)))
    return out


def compare(control: TokenLogprobs, candidate: TokenLogprobs) -> tuple[PositionStats, bool]:
    """The position statistics of one sequence, and whether they are approximated (a top-k engine)."""
    if control.full is not None and candidate.full is not None:
        if isinstance(control.full, np.ndarray) and isinstance(candidate.full, np.ndarray):
            return compare_full(control.full, candidate.full, control.target, candidate.target), False
        return compare_full_tensor(control.full, candidate.full, control.target, candidate.target), False
    return compare_topk(control.on_host(), candidate.on_host()), True


def compare_full(p_lp: np.ndarray, q_lp: np.ndarray, p_target: np.ndarray, q_target: np.ndarray) -> PositionStats:
    """Exact: KL(P ‖ Q) = Σ p (log p − log q) over the whole vocabulary, summed in float64."""
    if p_lp.shape != q_lp.shape:
        raise ValueError(f"the arms' distributions differ in shape: {p_lp.shape} vs {q_lp.shape} "
                         "(different vocabularies cannot be compared)")
    kl = (np.exp(p_lp) * (p_lp - q_lp)).sum(axis=-1, dtype=np.float64)
    agree = p_lp.argmax(axis=-1) == q_lp.argmax(axis=-1)
    return PositionStats(kl, agree, -p_target.astype(np.float64), -q_target.astype(np.float64))


def compare_full_tensor(p_lp, q_lp, p_target: np.ndarray, q_target: np.ndarray) -> PositionStats:
    """compare_full with torch, on the control's device (a numpy side is moved there): the same sums in float64."""
    import torch

    device = (p_lp if torch.is_tensor(p_lp) else q_lp).device  # where the tensor side already is
    p, q = torch.as_tensor(p_lp).to(device), torch.as_tensor(q_lp).to(device)
    if p.shape != q.shape:
        raise ValueError(f"the arms' distributions differ in shape: {tuple(p.shape)} vs {tuple(q.shape)} "
                         "(different vocabularies cannot be compared)")
    kl, agree = [], []
    for i in range(0, p.shape[0], ROWS):  # the temporaries of a few hundred rows at a time, not of the whole
        pc, qc = p[i:i + ROWS], q[i:i + ROWS]
        kl.append((pc.exp() * (pc - qc)).sum(dim=-1, dtype=torch.float64).cpu())
        agree.append((pc.argmax(dim=-1) == qc.argmax(dim=-1)).cpu())
    return PositionStats(torch.cat(kl).numpy(), torch.cat(agree).numpy(), -p_target.astype(np.float64),
                         -q_target.astype(np.float64))


def compare_topk(control: TokenLogprobs, candidate: TokenLogprobs) -> PositionStats:
    """Approximate KL on the control's top-k tokens plus one bucket for the rest (see the module docstring)."""
    k = control.topk_ids.shape[1] if control.full is None else candidate.topk_ids.shape[1]
    p_ids, p_lp = control.topk(k)
    q_ids, q_lp = candidate.topk(k)
    if candidate.full is not None:
        q_at = np.take_along_axis(candidate.full, p_ids, axis=-1).astype(np.float64)
    else:
        q_at = np.empty(p_ids.shape)
        for n in range(p_ids.shape[0]):
            known = dict(zip(q_ids[n].tolist(), q_lp[n].tolist()))
            floor = float(np.min(q_lp[n]))  # the most a token outside the candidate's top-k can have
            q_at[n] = [known.get(t, floor) for t in p_ids[n].tolist()]
    p_lp = p_lp.astype(np.float64)
    p = np.exp(p_lp)
    p_rest = np.clip(1.0 - p.sum(-1), 1e-12, 1.0)
    q_rest = np.clip(1.0 - np.exp(q_at).sum(-1), 1e-12, 1.0)
    kl = (p * (p_lp - q_at)).sum(-1) + p_rest * (np.log(p_rest) - np.log(q_rest))
    agree = p_ids[:, 0] == q_ids[:, 0]
    return PositionStats(kl, agree, -control.target.astype(np.float64), -candidate.target.astype(np.float64))
