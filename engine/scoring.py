"""Teacher forcing on the reference engine: the log-probs of given token sequences at every position.

`LLMEngine.score` calls `score_sequences`. Sequences are packed into prefill batches within the engine's
token budget and free KV blocks, run through the runner's own prefill path (the same attention backend,
KV layout and quantized layers a request would see) with logits taken at every scored position, and
their blocks are freed at once. Blocks are allocated with the prefix cache off: a cached prefix would
skip exactly the positions whose logits are wanted, and scored text must not warm the cache.
"""
from __future__ import annotations

import torch

from engine.sequence import SamplingParams, Sequence

MAX_SCORED_POSITIONS = 1024  # a batch's logits: 1024 x 49,152 x 4 bytes = 200 MB for SmolLM2's vocabulary


def _check(engine, token_ids_list: list[list[int]], starts: list[int]) -> None:
    if engine.has_unfinished():
        raise RuntimeError("LLMEngine.score runs between requests: it would take their KV blocks")
    if len(token_ids_list) != len(starts):
        raise ValueError(f"{len(token_ids_list)} sequences but {len(starts)} starts")
    for i, (ids, start) in enumerate(zip(token_ids_list, starts)):
        if not 1 <= start <= len(ids):
            raise ValueError(f"sequence {i}: start={start} must be in [1, {len(ids)}] (the first scored token "
                             "needs one token before it)")
        if len(ids) > engine.cfg.max_model_len:
            raise ValueError(f"sequence {i}: {len(ids)} tokens exceed engine.max_model_len={engine.cfg.max_model_len}")


def _batches(engine, token_ids_list: list[list[int]], starts: list[int]):
    """Index lists of sequences that fit one prefill: the token budget, the free blocks, the logits cap."""
    bm, cfg = engine.block_manager, engine.cfg
    batch, tokens, scored, blocks = [], 0, 0, 0
    for i, ids in enumerate(token_ids_list):
        need = -(-len(ids) // bm.block_size)
        n_scored = len(ids) - starts[i]
        full = (tokens + len(ids) > cfg.max_num_batched_tokens or scored + n_scored > MAX_SCORED_POSITIONS
                or blocks + need > bm.num_free_blocks)
        if batch and full:
            yield batch
            batch, tokens, scored, blocks = [], 0, 0, 0
        batch.append(i)
        tokens, scored, blocks = tokens + len(ids), scored + n_scored, blocks + need
    if batch:
        yield batch


def _score_batch(engine, seqs: list[Sequence], starts: list[int]) -> list[torch.Tensor]:
    bm = engine.block_manager
    prefix_cache, bm.enable_prefix_cache = bm.enable_prefix_cache, False
    try:
        for seq in seqs:
            bm.allocate(seq)
        input_ids, positions, meta, _ = engine.runner.prepare_prefill(seqs)
        index, offset = [], 0
        for seq, start in zip(seqs, starts):
            index += range(offset + start - 1, offset + len(seq) - 1)  # position p predicts token p + 1
            offset += len(seq)
        logits = engine.model(input_ids, positions, meta, torch.tensor(index, device=engine.device))
        logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()
    finally:
        for seq in seqs:
            if seq.block_table:
                bm.deallocate(seq)
        bm.enable_prefix_cache = prefix_cache
    return list(logprobs.split([len(s) - st for s, st in zip(seqs, starts)]))


@torch.inference_mode()
def score_sequences(engine, token_ids_list: list[list[int]], starts: list[int]) -> list[torch.Tensor]:
    _check(engine, token_ids_list, starts)
    out: list[torch.Tensor | None] = [None] * len(token_ids_list)
    for batch in _batches(engine, token_ids_list, starts):
        seqs = [Sequence(f"score-{i}", token_ids_list[i], SamplingParams(max_tokens=1)) for i in batch]
        for i, lp in zip(batch, _score_batch(engine, seqs, [starts[i] for i in batch])):
            out[i] = lp
    return out
