"""From sampled token ids on the device to text on the host. `batched_decode` is read here only.

off: every token of every sequence is copied to the host on its own (one device sync each) and
     detokenized on its own;
on:  one host copy per step for the whole batch, and one batched incremental detokenization call.
Both use the same incremental algorithm (a window of recent tokens, as vLLM does), so the text is the
same; only the number of syncs and tokenizer calls differs.
"""
from __future__ import annotations

import torch

from optladder.engine.sequence import Sequence


class Detokenizer:
    def __init__(self, tokenizer, batched: bool):
        self.tokenizer = tokenizer
        self.batched = batched
        self.host_copies = 0
        self.decode_calls = 0

    def to_host(self, token_ids: torch.Tensor) -> list[int]:
        if self.batched:
            self.host_copies += 1
            return token_ids.tolist()
        out = []
        for i in range(token_ids.shape[0]):
            self.host_copies += 1
            out.append(int(token_ids[i].item()))
        return out

    def update(self, seqs: list[Sequence]) -> list[str]:
        """Advance each sequence's text by its newest token; returns the new text of each."""
        windows = [(s.token_ids[s.prefix_offset:s.read_offset], s.token_ids[s.prefix_offset:]) for s in seqs]
        if self.batched:
            texts = self._decode([w[0] for w in windows] + [w[1] for w in windows])
            prefix_texts, full_texts = texts[:len(seqs)], texts[len(seqs):]
        else:
            prefix_texts, full_texts = [], []
            for prefix, full in windows:
                prefix_texts += self._decode([prefix])
                full_texts += self._decode([full])
        return [self._advance(s, p, f) for s, p, f in zip(seqs, prefix_texts, full_texts)]

    def _decode(self, batch: list[list[int]]) -> list[str]:
        self.decode_calls += 1
        return self.tokenizer.batch_decode(batch, skip_special_tokens=True)

    @staticmethod
    def _advance(seq: Sequence, prefix_text: str, full_text: str) -> str:
        # a partial UTF-8 character decodes to U+FFFD: wait for the next token before emitting it, unless
        # no token will come, so the streamed text always ends equal to decode(output ids)
        if len(full_text) <= len(prefix_text) or (full_text.endswith("\ufffd") and not seq.is_finished):
            return ""
        delta = full_text[len(prefix_text):]
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(seq.token_ids)
        seq.output_text += delta
        return delta
