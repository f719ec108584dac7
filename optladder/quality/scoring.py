"""BLEU and ROUGE of generated answers, against reference answers and against the control arm.

Corpus BLEU is sacrebleu's (0-100, with its signature so a number can be reproduced); ROUGE is
rouge-score's stemmed F-measure (0-1), the best over a prompt's references, averaged over prompts.
Per-prompt scores are kept so an A/B can pair them prompt by prompt.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


@dataclass
class QualityScores:
    """Outputs against reference answers."""

    bleu: float
    rouge1: float
    rouge2: float
    rougeL: float
    bleu_signature: str
    per_prompt: list[dict]  # {bleu, rouge1, rouge2, rougeL}, in prompt order


@dataclass
class ControlScores:
    """A candidate's outputs against the control arm's outputs on the same prompts."""

    bleu: float
    rougeL: float
    exact_match: float
    per_prompt: list[dict]  # {exact, rougeL}, in prompt order


def score_vs_references(outputs: list[str], references: list[list[str]]) -> QualityScores:
    """Corpus BLEU, mean per-prompt ROUGE-1/2/L, and per-prompt scores; references may be ragged."""
    _check_lengths(outputs, references, "references")
    for i, refs in enumerate(references):
        if not refs:
            raise ValueError(f"prompt {i} has no references; every prompt needs at least one")
    bleu, signature = _corpus_bleu(outputs, references)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    sentence_bleu = BLEU(effective_order=True)  # short answers: without it most sentence scores are 0
    per_prompt = []
    for out, refs in zip(outputs, references):
        # score_multi keeps, per key, the reference with the best F-measure
        rouge = scorer.score_multi(refs, out)
        per_prompt.append({"bleu": sentence_bleu.sentence_score(out, refs).score,
                           **{k: float(rouge[k].fmeasure) for k in ROUGE_KEYS}})
    means = {k: float(np.mean([p[k] for p in per_prompt])) for k in ROUGE_KEYS}
    return QualityScores(bleu=bleu, bleu_signature=signature, per_prompt=per_prompt, **means)


def score_vs_control(outputs: list[str], control_outputs: list[str]) -> ControlScores:
    """How far a candidate's outputs drifted from the control's: BLEU, ROUGE-L, exact-match rate.

    Exact match compares the raw strings: a lossless optimization must not change even whitespace.
    """
    _check_lengths(outputs, control_outputs, "control_outputs")
    bleu, _ = _corpus_bleu(outputs, [[c] for c in control_outputs])
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    per_prompt = []
    for out, ctl in zip(outputs, control_outputs):
        # identical strings agree fully even where rouge-score finds no tokens (both empty, "...")
        rouge_l = 1.0 if out == ctl else float(scorer.score(ctl, out)["rougeL"].fmeasure)
        per_prompt.append({"exact": out == ctl, "rougeL": rouge_l})
    return ControlScores(
        bleu=bleu,
        rougeL=float(np.mean([p["rougeL"] for p in per_prompt])),
        exact_match=float(np.mean([p["exact"] for p in per_prompt])),
        per_prompt=per_prompt,
    )


def to_metrics(scores: QualityScores | ControlScores, suffix: str | None = None) -> dict[str, float]:
    """MLflow metrics of docs/design.md: quality/<metric>_vs_ref or quality/<metric>_vs_control.

    suffix defaults by type (vs_ref, vs_control); pass another one (e.g. vs_ref_gpt4) for a second
    reference set.
    """
    if isinstance(scores, QualityScores):
        suffix = suffix or "vs_ref"
        values = {"bleu": scores.bleu, **{k: getattr(scores, k) for k in ROUGE_KEYS}}
    elif isinstance(scores, ControlScores):
        suffix = suffix or "vs_control"
        values = {"bleu": scores.bleu, "rougeL": scores.rougeL, "exact_match": scores.exact_match}
    else:
        raise TypeError(f"to_metrics takes QualityScores or ControlScores, got {type(scores).__name__}")
    return {f"quality/{k}_{suffix}": float(v) for k, v in values.items()}


def _corpus_bleu(outputs: list[str], references: list[list[str]]) -> tuple[float, str]:
    # sacrebleu wants reference *streams* (stream j = the j-th reference of every prompt); a prompt
    # with fewer references is padded with None, which sacrebleu skips. Padding with "" would count
    # as a real empty reference and skew the brevity penalty's closest reference length.
    width = max(len(refs) for refs in references)
    streams = [[refs[j] if j < len(refs) else None for refs in references] for j in range(width)]
    bleu = BLEU()
    score = bleu.corpus_score(outputs, streams)
    return float(score.score), str(bleu.get_signature())


def _check_lengths(outputs: list[str], other: list, other_name: str) -> None:
    if not outputs:
        raise ValueError("no outputs to score: got an empty list")
    if len(outputs) != len(other):
        raise ValueError(f"{len(outputs)} outputs but {len(other)} {other_name}; they must pair one to one")
