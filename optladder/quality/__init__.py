"""Output quality: prompt sets, BLEU/ROUGE scoring against references and the control arm, review export.

Plain Python plus sacrebleu, rouge-score and numpy: no torch, Hydra or MLflow, so it runs from a test
or a notebook; experiments/ feeds it outputs and logs what `to_metrics` returns.

The names below load on first use (PEP 562), so a submodule that needs neither sacrebleu nor rouge-score
(quality.teacher_forced, quality.prompts) imports on a machine without them, e.g. a GPU image.
"""
from __future__ import annotations

import importlib

_WHERE = {
    "PromptItem": "optladder.quality.item",
    "PROMPT_SETS": "optladder.quality.prompts", "QualityConfig": "optladder.quality.prompts", "load_prompt_set": "optladder.quality.prompts",
    "prompts_digest": "optladder.quality.prompts",
    "write_review_html": "optladder.quality.review",
    "ControlScores": "optladder.quality.scoring", "QualityScores": "optladder.quality.scoring", "score_vs_control": "optladder.quality.scoring",
    "score_vs_references": "optladder.quality.scoring", "to_metrics": "optladder.quality.scoring",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'quality' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
