"""Teacher forcing on the reference engine: the log-probs of given token sequences at every position.

`LLMEngine.score` calls `score_sequences`. A sequence is a prompt (tokens before `start`) and a continuation
(from `start` on) whose tokens are scored, each given those before it, as generation would have seen them:
1. the prompts are prefilled, as a request's prompt is: its last position gives the first continuation
   token's log-probs;
2. the continuations (all but their last token) run as one more step over the cached prompts, the path a
   prompt's later chunk takes (chunked prefill): each position attends to its context read back from the
   KV cache, as a decode step does. So a lossy cache (kv_fp8) counts here as it counts in generation; a
   single prefill would attend to fresh keys and values and never see it.
Sequences are packed into batches within the engine's token budget and free KV blocks, through the runner's
own prefill path (the same attention backend, KV layout and quantized layers a request would see), with
logits taken at every scored position; their blocks are freed at once. Blocks are allocated with the
prefix cache off: scored text must not warm the cache for later requests.
"""
from __future__ import annotations

import torch

from optladder.engine.batch import Batch
from optladder.engine.sequence import SamplingParams, Sequence

MAX_SCORED_POSITIONS = 512  # a batch's logits: 512 x 49,152 x 4 bytes = 100 MB for SmolLM2's vocabulary


def _check(engine, token_ids_list: list[list[int]], starts: list[int]) -> None:
    if engine.has_unfinished():
        raise RuntimeError("LLMEngine.score runs between requests: it would take their KV blocks")
    if len(token_ids_list) != len(starts):
        raise ValueError(f"{len(token_ids_list)} sequences but {len(starts)} starts")
    for i, (ids, start) in enumerate(zip(token_ids_list, starts)):
        if not 1 <= start < len(ids):
            raise ValueError(f"sequence {i}: start={start} must be in [1, {len(ids) - 1}] (the first scored token "
                             "needs one token before it, and one token at least is scored)")
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


def _forward(engine, seqs: list[Sequence], num_new: list[int], all_rows: bool, on_device: bool) -> torch.Tensor:
    """One varlen step through the runner's input path and the layers a varlen step of generation runs
    (the fused kernels where the runner's DecodeKernels and attention backend take them), log-probs on the
    host (or on the device: on_device): of every computed row (all_rows), or of each sequence's last row."""
    runner = engine.runner
    input_ids, positions, meta, last = runner.prepare_varlen(Batch(seqs, num_new))
    index = torch.arange(len(input_ids), device=engine.device) if all_rows else last
    logits = engine.model(input_ids, positions, meta, index, fused=runner._fused_varlen(meta),
                          skinny=runner.kernels.skinny)
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp if on_device else lp.cpu()


def _score_batch(engine, token_ids: list[list[int]], starts: list[int], on_device: bool) -> list[torch.Tensor]:
    bm = engine.block_manager
    # the inputs: every token but the last, which is only scored
    seqs = [Sequence(f"score-{i}", ids[:-1], SamplingParams(max_tokens=1)) for i, ids in enumerate(token_ids)]
    prefix_cache, bm.enable_prefix_cache = bm.enable_prefix_cache, False
    try:
        for seq in seqs:
            bm.allocate(seq)
        prompts = []
        for seq, start in zip(seqs, starts):
            p = Sequence(seq.request_id, seq.token_ids[:start], seq.params)
            p.block_table = seq.block_table  # the prompt's KV goes into the blocks of the whole sequence
            prompts.append(p)
        # 1. each prompt's last position
        first = _forward(engine, prompts, list(starts), all_rows=False, on_device=on_device)
        rest = [(seq, st) for seq, st in zip(seqs, starts) if len(seq) > st]
        for seq, st in rest:
            seq.num_computed_tokens = st  # 2. the prompt is in the cache: only the continuation is computed
        n_new = [len(seq) - st for seq, st in rest]
        later = iter(_forward(engine, [s for s, _ in rest], n_new, all_rows=True,
                                 on_device=on_device).split(n_new) if rest else [])
    finally:
        for seq in seqs:
            if seq.block_table:
                bm.deallocate(seq)
        bm.enable_prefix_cache = prefix_cache
    return [torch.cat([first[i:i + 1], next(later)]) if len(seq) > st else first[i:i + 1]
            for i, (seq, st) in enumerate(zip(seqs, starts))]


@torch.inference_mode()
def score_sequences(engine, token_ids_list: list[list[int]], starts: list[int],
                    on_device: bool = False) -> list[torch.Tensor]:
    """Each sequence's log-probs [len - start, vocab], float32, on the host (on_device: left on the engine's device)."""
    _check(engine, token_ids_list, starts)
    out: list[torch.Tensor | None] = [None] * len(token_ids_list)
    for batch in _batches(engine, token_ids_list, starts):
        for i, lp in zip(batch, _score_batch(engine, [token_ids_list[i] for i in batch], [starts[i] for i in batch],
                                                   on_device)):
            out[i] = lp
    return out
