"""Prompts of exactly the recorded length, in the model's own tokens, cut from real text.

Traces record lengths, not text. The cost of a request depends on its token count, so every prompt is
built in token space: a pool of real prompt text (the ShareGPT prompts under the data root, or the
project's own `builtin_text.txt`) is tokenized once, and each prompt is a window of the needed length cut
from it (wrapping around, so any length can be served). Decoded text is never re-tokenized: decode and
encode do not round-trip exactly, and the lengths must. Window starts are drawn without replacement, so
two unrelated prompts do not share a first block by accident and fool a prefix cache.

Shared prefixes (Mooncake `hash_ids`): each distinct hash id stands for one block of `block_tokens`
tokens, cut once from the pool; a prompt is the concatenation of its blocks, cut to its length. Rows whose
hash-id lists share a leading run therefore share exactly those token ids, as in the real trace.
A prompt clipped to a shorter length keeps its first ceil(length / block_tokens) blocks.

`prefix_hit_rate` is the prefix-cache hit rate the hash ids promise, counted as the reference engine counts
its own `perf/prefix_hit_rate`: on the trace's blocks (512 tokens) and on the blocks as replayed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from optladder.traffic.data_root import resolve_data_path
from optladder.traffic.traces import TraceRow, load_trace

PROMPT_SOURCES = ("auto", "sharegpt", "builtin")
SHAREGPT_PATH = "prompts/sharegpt_500.json"  # under the data root
BUILTIN_TEXT = Path(__file__).with_name("builtin_text.txt")
# How far (absolute, as a share of blocks) fitting may move the hit rate the hash ids promise before a
# workload says its replay does not have the trace's prefix reuse.
PREFIX_HIT_CHANGE_WARN = 0.05


@dataclass
class TokenPool:
    ids: np.ndarray  # every text's tokens, concatenated with a paragraph break between texts
    source: str  # the file the text came from

    def window(self, start: int, length: int) -> list[int]:
        return self.ids[(start + np.arange(length)) % len(self.ids)].tolist()


def prompt_texts(prompt_source: str, data_root: str | None, tokenizer: Any) -> tuple[list[str], str]:
    """Texts to cut prompts from and where they came from. auto: ShareGPT when the data root has it."""
    if prompt_source not in PROMPT_SOURCES:
        raise ValueError(f"prompt_source {prompt_source!r} is not one of {', '.join(PROMPT_SOURCES)}")
    if prompt_source == "sharegpt" or (prompt_source == "auto" and _has_sharegpt(data_root)):
        trace = load_trace("sharegpt", SHAREGPT_PATH, on_bad_row="skip", data_root=data_root,
                           tokenizer=tokenizer)
        return [r.prompt_text for r in trace.rows if r.prompt_text and r.prompt_text.strip()], trace.path
    paragraphs = BUILTIN_TEXT.read_text(encoding="utf-8").split("\n\n")
    return [p.strip() for p in paragraphs if p.strip()], str(BUILTIN_TEXT)


def _has_sharegpt(data_root: str | None) -> bool:
    try:
        resolve_data_path(SHAREGPT_PATH, data_root)
    except FileNotFoundError:
        return False
    return True


def build_pool(texts: Sequence[str], tokenizer: Any, source: str) -> TokenPool:
    """Tokenize every text once and concatenate them into one stream of token ids."""
    sep = tokenizer.encode("\n\n", add_special_tokens=False)
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
        ids.extend(sep)
    if not ids:
        raise ValueError(f"prompt text from {source} gives no tokens; check the file, or set "
                         f"workload.prompt_source=builtin")
    return TokenPool(np.asarray(ids, dtype=np.int64), source)


def materialize(rows: Sequence[TraceRow], pool: TokenPool, tokenizer: Any, seed: int,
                block_tokens: int = 512) -> list[list[int]]:
    """Token ids of exactly `row.input_len` per row. A row's own prompt text is used where it has one
    (cut to length, topped up from the pool if short); hash-id rows get their shared blocks."""
    return materialize_with_sources(rows, pool, tokenizer, seed, block_tokens)[0]


def materialize_with_sources(rows: Sequence[TraceRow], pool: TokenPool, tokenizer: Any, seed: int,
                             block_tokens: int = 512) -> tuple[list[list[int]], list[str]]:
    """materialize, and where each prompt's tokens came from: own (the row's text), own+pool, pool."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    need = [math.ceil(r.input_len / block_tokens) for r in rows]
    hashes = list(dict.fromkeys(h for r, nb in zip(rows, need) if r.prompt_text is None
                                for h in (r.hash_ids or [])[:nb]))
    # One window start per hash block and per row (its filler), all distinct while the pool allows.
    units = len(hashes) + len(rows)
    rng = np.random.default_rng(seed)
    starts = rng.choice(len(pool.ids), size=units, replace=units > len(pool.ids)).tolist()
    block_start = dict(zip(hashes, starts))
    prompts, sources = [], []
    for i, (row, nb) in enumerate(zip(rows, need)):
        if row.prompt_text is not None:
            ids = tokenizer.encode(row.prompt_text, add_special_tokens=False)[:row.input_len]
        else:
            ids = [t for h in (row.hash_ids or [])[:nb] for t in pool.window(block_start[h], block_tokens)]
            ids = ids[:row.input_len]
        own = row.prompt_text is not None and len(ids) > 0
        if len(ids) < row.input_len:
            ids.extend(pool.window(starts[len(hashes) + i], row.input_len - len(ids)))
            sources.append("own+pool" if own else "pool")
        else:
            sources.append("own" if own else "pool")
        assert len(ids) == row.input_len
        prompts.append(ids)
    return prompts, sources


def sources_label(sources: list[str], pool_source: str) -> str:
    """Where the prompts' tokens really came from, counted: the label a workload's summary carries."""
    n = len(sources)
    parts = [f"{sources.count('own')} of {n} from the trace's own prompt text" if "own" in sources else "",
             f"{sources.count('own+pool')} of {n} from their own text topped up from {pool_source}"
             if "own+pool" in sources else "",
             f"{sources.count('pool')} of {n} cut from {pool_source}" if "pool" in sources else ""]
    return "; ".join(p for p in parts if p)


def prefix_groups(rows: Sequence[TraceRow]) -> list[str | None]:
    """A group name per row whose first hash block is shared with another row of the list, else None."""
    firsts = [r.hash_ids[0] if r.hash_ids and r.prompt_text is None else None for r in rows]
    counts: dict[int, int] = {}
    for h in firsts:
        if h is not None:
            counts[h] = counts.get(h, 0) + 1
    return [f"hash-{h}" if h is not None and counts[h] > 1 else None for h in firsts]


def prefix_hit_rate(rows: Sequence[TraceRow], block_tokens: int) -> float | None:
    """The prefix-cache hit rate of rows replayed in their order through a cache that is empty at the first
    row and never evicts, counted as the reference engine counts hits (optladder/engine/block_manager.py):

    - a row of input length L covers ceil(L / B) block positions of B = block_tokens tokens; position i is the
      hash block hash_ids[i] while i < len(hash_ids), else the row's own filler (never shared). Rows with their
      own prompt text have no shared blocks (materialize does not use their hash ids).
    - queried: the full blocks before the last prompt token, (L - 1) // B per row: the engine computes at
      least one prompt token, for its logits, and queries only blocks before it.
    - hit: a queried position i whose chain hash_ids[0..i] (a block is reused only after the same blocks,
      the engine's chained hash) was a full block, position j < L' // B, of an earlier row. A miss ends the
      row's reuse, as in the engine.

    Hit rate = hits / queried blocks, pooled over rows; None when no row has hash ids or none queries a
    block. With rows clipped by fit_lengths each keeps only its first blocks, so the rate on the fitted rows
    is the reuse the replay can show. The engine counts blocks of engine.block_size and evicts when its pool
    is full, so its own rate matches this one for block_tokens a multiple of its block size and a pool that
    holds the window."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    if not any(r.hash_ids and r.prompt_text is None for r in rows):
        return None
    seen: dict[tuple[int, int], int] = {}  # (parent chain node, hash id) -> chain node: a trie of full blocks
    hits = queried = 0
    for r in rows:
        hashes = r.hash_ids if r.prompt_text is None and r.hash_ids else []
        n_query = max(0, r.input_len - 1) // block_tokens
        queried += n_query
        node = -1
        for h in hashes[:n_query]:
            node = seen.get((node, h), -2)
            if node == -2:
                break
            hits += 1
        node = -1
        for h in hashes[:r.input_len // block_tokens]:  # this row's full blocks, reusable by the rows after it
            node = seen.setdefault((node, h), len(seen))
    return hits / queried if queried else None
