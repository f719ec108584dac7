"""Teacher-forced scoring over an OpenAI-compatible endpoint: vLLM's `prompt_logprobs` on /v1/completions.

The prompt is the whole token sequence and one token is generated; vLLM then returns, for every prompt
position, the log-prob of the actual token and of its top-k alternatives, keyed by token id. That is all a
server gives: no full distribution, so the KL built on it is approximate (optladder/quality/teacher_forced.py says
how). An endpoint that returns no prompt log-probs (OpenAI's own API, SGLang) cannot be scored: the
teacher-forced measures of that arm are then unmeasured, with this module's reason, never passed.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from optladder.backends.completions import EndpointError, post_json
from optladder.quality.teacher_forced import TokenLogprobs

TOP_K = 20  # vLLM's default --max-logprobs: the most prompt_logprobs a stock server returns


class ScoringUnavailable(RuntimeError):
    """This engine cannot return the log-probs teacher forcing needs; the message says why."""


def _parse(entries: list, ids: list[int], start: int, k: int) -> TokenLogprobs:
    target, top_ids, top_lp = [], [], []
    for pos in range(start, len(ids)):
        entry = entries[pos] or {}
        lps = {int(t): float(v["logprob"] if isinstance(v, dict) else v) for t, v in entry.items()}
        if ids[pos] not in lps:
            raise ScoringUnavailable(f"prompt_logprobs at position {pos} lacks the prompt's own token {ids[pos]}")
        target.append(lps[ids[pos]])
        best = sorted(lps.items(), key=lambda kv: -kv[1])[:k]
        best += [best[-1]] * (k - len(best))  # a short list repeats its last entry: the same lower bound
        top_ids.append([t for t, _ in best])
        top_lp.append([v for _, v in best])
    return TokenLogprobs(target=np.array(target), topk_ids=np.array(top_ids), topk_logprobs=np.array(top_lp))


def prompt_logprobs(base_url: str, model: str, token_ids_list: list[list[int]], starts: list[int],
                    api_key: str | None = None, k: int = TOP_K, concurrency: int = 8,
                    timeout_s: float = 600.0) -> list[TokenLogprobs]:
    url = base_url.rstrip("/") + "/v1/completions"

    def one(i: int) -> TokenLogprobs:
        body = {"model": model, "prompt": token_ids_list[i], "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": k}
        try:
            resp = post_json(url, body, api_key, timeout_s)
        except EndpointError as e:
            raise ScoringUnavailable(f"the endpoint refused prompt_logprobs ({e})") from None
        entries = ((resp.get("choices") or [{}])[0] or {}).get("prompt_logprobs")
        if not entries:
            raise ScoringUnavailable(f"{url} returned no prompt_logprobs (it is vLLM's extension of the "
                                     "completions API; this endpoint does not offer it)")
        return _parse(entries, token_ids_list[i], starts[i], k)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(one, range(len(token_ids_list))))
