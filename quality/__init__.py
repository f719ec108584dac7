"""Output quality: prompt sets, BLEU/ROUGE scoring against references and the control arm, review export.

Plain Python plus sacrebleu, rouge-score and numpy: no torch, Hydra or MLflow, so it runs from a test
or a notebook; experiments/ feeds it outputs and logs what `to_metrics` returns.
"""
from quality.item import PromptItem
from quality.prompts import PROMPT_SETS, QualityConfig, load_prompt_set, prompts_digest
from quality.review import write_review_html
from quality.scoring import ControlScores, QualityScores, score_vs_control, score_vs_references, to_metrics

__all__ = [
    "PROMPT_SETS", "PromptItem", "QualityConfig", "load_prompt_set", "prompts_digest",
    "QualityScores", "ControlScores", "score_vs_references", "score_vs_control", "to_metrics",
    "write_review_html",
]
