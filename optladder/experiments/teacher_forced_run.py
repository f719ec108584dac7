"""The teacher-forced phase of an A/B (or a ladder rung) whose candidate is lossy.

After both arms ran, their engines are loaded again side by side, score the same token sequences (each
quality prompt followed by its reference, and followed by the control's greedy answer), and their next-token
distributions are compared position by position (optladder/quality/teacher_forced.py). Both at once, because the
exact KL needs both full distributions: keeping one arm's for 200 prompts would take gigabytes (SmolLM2:
~18,000 positions x 49,152 tokens x 4 bytes), and a top-k summary makes the KL approximate. Only per-prompt
sums are kept. The results go to the candidate's run directory (teacher_forced.json, one line a prompt
in teacher_forced.jsonl) and to its MLflow run under optladder/quality/.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
from tqdm import tqdm

from optladder.quality.prompts import PromptItem, load_prompt_set
from optladder.quality.teacher_forced import Accumulator, TeacherForcedScores, build_sequences, compare, to_metrics

log = logging.getLogger(__name__)
BATCH = 16  # sequences a scoring call, one progress step
# KV cache of each scoring engine, at most: both arms are loaded at once, and a serving budget each (60 GiB for
# the 8B shape on an H200) would not fit twice beside two sets of weights. Scoring packs its sequences into the
# blocks it has (optladder/engine/scoring.py): a smaller cache means smaller batches, the same for both arms.
SCORING_KV_GB = 16.0


def scoring_cfg(cfg):
    """An arm's config for scoring: its KV cache capped at SCORING_KV_GB, everything else as it ran."""
    import copy

    from omegaconf import open_dict

    gb = cfg.engine.get("kv_cache_gb")
    if gb is None or gb <= SCORING_KV_GB:
        return cfg
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.engine.kv_cache_gb = SCORING_KV_GB
    return cfg


def _sequences(tokenizer, items: list[PromptItem], control_outputs: list[str]):
    from optladder.engine.tokenizer import chat_token_ids

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    prompts = [chat_token_ids(tokenizer, it.chat()) for it in items]  # as the quality phase sent them
    return build_sequences(prompts, [encode(it.references[0]) for it in items], [encode(o) for o in control_outputs])


def _same_tokens(control, candidate, items: list[PromptItem]) -> bool:
    probe = " ".join(it.prompt for it in items[:8])
    return control.tokenizer.encode(probe) == candidate.tokenizer.encode(probe)


def score_pair(control, candidate, items: list[PromptItem], control_outputs: list[str], max_len: int,
               progress: bool = True) -> TeacherForcedScores:
    """Both backends score every sequence; the comparison is summed per prompt as it goes."""
    from optladder.backends.scoring import TOP_K, ScoringUnavailable

    if not _same_tokens(control, candidate, items):
        return TeacherForcedScores.not_measured("the arms tokenize the prompts differently (different models?): "
                                                "their distributions cannot be compared position by position")
    seqs = _sequences(control.tokenizer, items, control_outputs)
    kept = [s for s in seqs if len(s.token_ids) <= max_len]
    acc, approximated = Accumulator(len(items)), None
    try:
        with tqdm(total=len(kept), desc="teacher-forced", unit="seq", disable=not progress) as bar:
            for i in range(0, len(kept), BATCH):
                batch = kept[i:i + BATCH]
                ids, starts = [s.token_ids for s in batch], [s.start for s in batch]
                for seq, p, q in zip(batch, control.score(ids, starts), candidate.score(ids, starts)):
                    stats, approx = compare(p, q)
                    acc.add(seq, stats)
                    if approx:
                        approximated = (f"an engine returned only its top-{TOP_K} log-probs: KL over the control's "
                                        f"top-{TOP_K} tokens plus one bucket for the rest, a lower bound")
                bar.update(len(batch))
    except ScoringUnavailable as e:
        return TeacherForcedScores.not_measured(str(e))
    return acc.result(skipped=len(seqs) - len(kept), approximated=approximated)


def run_teacher_forced(control_cfg, candidate_cfg, control_outputs: list[str], out_dir: Path | None = None,
                       items: list[PromptItem] | None = None) -> TeacherForcedScores:
    """control_cfg, candidate_cfg: the arms' composed configs (DictConfig); items: the control's quality
    prompts as its preflight loaded them (None: loaded again from its config)."""
    from optladder.backends import make_backend
    from optladder.experiments.build import build

    c, k = build(scoring_cfg(control_cfg)), build(scoring_cfg(candidate_cfg))
    if items is None:
        items = load_prompt_set(c.quality, c.data.root)
    if len(items) != len(control_outputs):
        return TeacherForcedScores.not_measured(f"{len(control_outputs)} control outputs for {len(items)} prompts")
    # two vLLM servers: both launched, then both awaited (their starts overlap); beside an in-process engine a
    # server is awaited at once, so that neither's memory check sees the other half-started
    both = c.engine.name == k.engine.name == "vllm"
    ctrl = make_backend(c.model, c.engine, wait=not both)
    try:
        cand = make_backend(k.model, k.engine, wait=not both)
        try:
            ctrl.wait_ready()
            cand.wait_ready()
            max_len = min(c.engine.max_model_len, k.engine.max_model_len)
            tf = score_pair(ctrl, cand, items, control_outputs, max_len, c.replay.progress)
        finally:
            cand.close()
    finally:
        ctrl.close()
    if out_dir is not None:
        write_results(Path(out_dir), tf, items)
    return tf


def write_results(out_dir: Path, tf: TeacherForcedScores, items: list[PromptItem]) -> None:
    summary = {"metrics": to_metrics(tf), "skipped_sequences": tf.skipped, "approximated": tf.approximated,
               "unavailable": tf.unavailable}
    (out_dir / "teacher_forced.json").write_text(json.dumps(summary, indent=2))
    if tf.unavailable:
        return
    with open(out_dir / "teacher_forced.jsonl", "w") as f:
        for i, it in enumerate(items):
            n, r = tf.positions[i], tf.ref_tokens[i]
            f.write(json.dumps({
                "id": it.id, "positions": int(n), "kl_mean": tf.kl_sum[i] / n if n else None,
                "top1_agree": tf.top1_agree[i] / n if n else None,
                "ref_ppl_control": float(np.exp(tf.ref_nll_control[i] / r)) if r else None,
                "ref_ppl_candidate": float(np.exp(tf.ref_nll_candidate[i] / r)) if r else None}) + "\n")


def log_to_run(tracking, run_id: str | None, metrics: dict[str, float]) -> None:
    """Add the measures to the candidate's (finished) MLflow run."""
    if not (tracking.enabled and run_id and metrics):
        return
    import time

    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from optladder.experiments.tracking import resolve_uri

    mlflow.set_tracking_uri(resolve_uri(tracking.uri))
    now = int(time.time() * 1000)
    MlflowClient().log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
