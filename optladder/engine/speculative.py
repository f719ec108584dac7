"""Speculative decoding (`speculative`): cheap drafts for the next tokens of a sequence, verified by the
model in the step that computes its next token. The engine reads the switch once (optladder/engine/llm_engine.py) and
builds a Speculator; the scheduler reserves the drafts' KV slots (Batch.lookahead), the model runner
computes their logits, and this module proposes the drafts and decides which are accepted.

Drafts (method):
- ngram: prompt lookup. The sequence's last ngram_max .. ngram_min tokens are looked up earlier in its own
  context (prompt and output); the tokens that followed the latest match are the drafts. No second model:
  it pays where answers repeat their prompt (rewrite, fix, reformat) and costs little where they don't.
- draft_layers: self-speculation. The model's first num_draft_layers layers, with its own final norm and
  head, run k decode passes; the drafts are their greedy tokens. Those layers' KV is the full model's, so
  the draft reads the cache the model wrote and needs none of its own.

Verification keeps the target's tokens: greedy, a draft is accepted while it equals the model's argmax, and
the step emits the accepted drafts plus the model's own next token, exactly what one-token steps emit (up
to the floating-point order of a k + 1-row step). At temperature > 0 the runner applies rejection sampling
(optladder/engine/model_runner.py: a draft proposed with certainty is kept with probability p(draft), else a token is
drawn from p without it), which leaves the output distribution unchanged, though not the seeded draws.
"""
from __future__ import annotations

from optladder.engine.batch import Batch
from optladder.engine.config import SpeculativeConfig
from optladder.engine.model import LlamaShape
from optladder.engine.sequence import Sequence


def validate_speculative(spec: SpeculativeConfig, shape: LlamaShape, max_model_len: int) -> None:
    """What the model's shape and the context decide, refused before a weight loads (the config's own
    checks ran when it was built: SpeculativeConfig.__post_init__)."""
    if not spec:
        return
    if spec.num_draft_tokens > max_model_len - 2:
        raise ValueError(f"engine.speculative.num_draft_tokens={spec.num_draft_tokens} does not fit "
                         f"engine.max_model_len={max_model_len} (a token of prompt, the drafts and the model's "
                         f"own next token): valid 1..{max_model_len - 2}")
    if spec.method == "draft_layers" and spec.num_draft_layers >= shape.num_hidden_layers:
        raise ValueError(f"engine.speculative.num_draft_layers={spec.num_draft_layers}: the draft must be "
                         f"fewer layers than the model's {shape.num_hidden_layers}; valid "
                         f"1..{shape.num_hidden_layers - 1}")


class NgramProposer:
    """Prompt lookup over an index per sequence: for each n, each n-gram -> where the token after its latest
    occurrence is. Built incrementally (a few dict writes per new token), so a step costs O(k), not O(len)."""

    def __init__(self, spec: SpeculativeConfig):
        self.sizes = range(spec.ngram_max, spec.ngram_min - 1, -1)  # the longest match first
        self.index: dict[int, tuple[int, dict[int, dict[tuple[int, ...], int]]]] = {}

    def propose_rows(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        return [self.propose(seq, k) for seq, k in zip(seqs, ks)]

    def propose(self, seq: Sequence, k: int) -> list[int]:
        toks, length = seq.token_ids, len(seq)
        upto, maps = self.index.get(seq.seq_id, (1, {n: {} for n in self.sizes}))
        for i in range(upto, length):  # n-grams ending before the newest token, each with its successor i
            for n in self.sizes:
                if i >= n:
                    maps[n][tuple(toks[i - n:i])] = i
        self.index[seq.seq_id] = (length, maps)
        for n in self.sizes:
            start = maps[n].get(tuple(toks[length - n:]))
            if start is not None:
                # past the end of the context the match continues into the drafts themselves: a repeating
                # pattern is drafted in full
                drafts: list[int] = []
                for j in range(start, start + k):
                    drafts.append(toks[j] if j < length else drafts[j - length])
                return drafts
        return []

    def release(self, seq: Sequence) -> None:
        self.index.pop(seq.seq_id, None)


class LayerDraftProposer:
    """k greedy decode passes of the model's first num_draft_layers layers, for every drafting row at once."""

    def __init__(self, spec: SpeculativeConfig, runner):
        self.num_layers = spec.num_draft_layers
        self.runner = runner

    def propose_rows(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in seqs]
        tokens = [s.last_token for s in seqs]
        for j in range(max(ks)):
            live = [i for i, k in enumerate(ks) if k > j]
            logits = self.runner.draft_logits([seqs[i] for i in live], [tokens[i] for i in live],
                                              [len(seqs[i]) - 1 + j for i in live], self.num_layers)
            for i, tok in zip(live, logits.argmax(dim=-1).tolist()):
                drafts[i].append(tok)
                tokens[i] = tok
        return drafts

    def release(self, seq: Sequence) -> None:
        pass


class Speculator:
    def __init__(self, spec: SpeculativeConfig, runner):
        self.spec = spec
        self.proposer = NgramProposer(spec) if spec.method == "ngram" else LayerDraftProposer(spec, runner)
        self.reset()

    def reset(self) -> None:
        self.verify_steps = 0  # steps that verified at least one draft
        self.verifications = 0  # sequence-steps with drafts
        self.no_draft_rows = 0  # sequence-steps with draft slots but nothing proposed (an n-gram miss)
        self.proposed = 0
        self.accepted = 0
        self.draft_passes = 0  # draft_layers: forward passes of the draft layers

    def propose(self, batch: Batch) -> None:
        """Fill batch.drafts, up to each row's reserved slots."""
        rows = [i for i, k in enumerate(batch.lookahead) if k]
        drafts = self.proposer.propose_rows([batch.seqs[i] for i in rows], [batch.lookahead[i] for i in rows])
        for i, d in zip(rows, drafts):
            assert len(d) <= batch.lookahead[i]
            batch.drafts[i] = d
        if isinstance(self.proposer, LayerDraftProposer):
            self.draft_passes += max(batch.lookahead)
        self.no_draft_rows += sum(not batch.drafts[i] for i in rows)
        self.verify_steps += batch.has_drafts

    def accept(self, drafts: list[list[int]], targets: list[int]) -> list[list[int]]:
        """Per sampled sequence (drafts: its drafts; targets: the runner's token for each of its logits rows,
        all sequences' rows in order), the tokens it emits: the drafts up to the first that differs from the
        target at its position, then the target there."""
        out, row = [], 0
        for d in drafts:
            t = targets[row:row + len(d) + 1]
            row += len(d) + 1
            a = 0
            while a < len(d) and d[a] == t[a]:
                a += 1
            out.append(t[:a + 1])
            if d:
                self.verifications += 1
                self.proposed += len(d)
                self.accepted += a
        assert row == len(targets)
        return out

    def release(self, seq: Sequence) -> None:
        self.proposer.release(seq)

    def metrics(self) -> dict[str, float]:
        return {"spec/acceptance_rate": self.accepted / max(1, self.proposed),
                "spec/accepted_per_verification": self.accepted / max(1, self.verifications),
                "spec/drafts_proposed": float(self.proposed), "spec/drafts_accepted": float(self.accepted),
                "spec/verify_steps": float(self.verify_steps)}

    def evidence(self) -> dict:
        s = self.spec
        out = {"on": True, "method": s.method, "num_draft_tokens": s.num_draft_tokens,
               "verify_steps": self.verify_steps, "verifications": self.verifications,
               "drafts_proposed": self.proposed, "drafts_accepted": self.accepted,
               "acceptance_rate": round(self.accepted / max(1, self.proposed), 4),
               # tokens a sequence gets from one verification: the accepted drafts and the model's own
               "tokens_per_verification": round(1 + self.accepted / max(1, self.verifications), 3),
               "rows_without_drafts": self.no_draft_rows, "disable_by_batch_size": s.disable_by_batch_size}
        if s.method == "ngram":
            out["ngram"] = [s.ngram_min, s.ngram_max]
        else:
            out.update(num_draft_layers=s.num_draft_layers, draft_passes=self.draft_passes)
        return out
