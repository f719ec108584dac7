"""Greedy quality outputs from any OpenAI-compatible server: POST /v1/completions with the prompt as token
ids (the chat template was applied on our side, so every engine sees the identical prompt), several
requests in flight, outputs in prompt order. Stdlib only.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm


class EndpointError(RuntimeError):
    """The server answered with an error, or not at all."""


def post_json(url: str, body: dict, api_key: str | None = None, timeout_s: float = 600.0) -> dict:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", errors="replace")[:500]
        raise EndpointError(f"POST {url}: HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        raise EndpointError(f"POST {url}: {e}") from None


def get_json(url: str, api_key: str | None = None, timeout_s: float = 30.0) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise EndpointError(f"GET {url}: HTTP {e.code}: {e.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError) as e:
        raise EndpointError(f"GET {url}: {e}") from None


def greedy_completions(base_url: str, model: str, prompts: list[list[int]], max_new_tokens: int,
                       max_model_len: int | None = None, concurrency: int = 8, api_key: str | None = None,
                       timeout_s: float = 600.0, progress: bool = True) -> list[str]:
    """One greedy completion per prompt, stopping at EOS. A prompt that leaves no room to answer within
    max_model_len gets '' without a request, as the reference engine does (the caller counts those)."""
    url = base_url.rstrip("/") + "/v1/completions"
    room = [max_new_tokens if max_model_len is None else min(max_new_tokens, max_model_len - len(p)) for p in prompts]
    outputs = [""] * len(prompts)
    keep = [i for i, r in enumerate(room) if r >= 1]

    def one(i: int) -> tuple[int, str]:
        body = {"model": model, "prompt": prompts[i], "max_tokens": room[i], "temperature": 0.0, "stream": False}
        resp = post_json(url, body, api_key, timeout_s)
        try:
            return i, resp["choices"][0]["text"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"POST {url}: no choices[0].text in the answer: {str(resp)[:300]}") from None

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool, \
            tqdm(total=len(keep), desc="quality", unit="prompt", disable=not progress) as bar:
        for i, text in pool.map(one, keep):
            outputs[i] = text
            bar.update(1)
    return outputs


def _token(t):
    """vLLM's `return_tokens_as_token_ids` spells a token "token_id:123": the id; any other server's string as is."""
    if isinstance(t, str) and t.startswith("token_id:") and t[9:].lstrip("-").isdigit():
        return int(t[9:])
    return t


def greedy_traced(base_url: str, model: str, prompts: list[list[int]], max_new_tokens: int, max_model_len: int | None,
                  top_k: int, concurrency: int = 8, api_key: str | None = None, timeout_s: float = 600.0,
                  progress: bool = True):
    """greedy_completions with the server's top_k log-probs at every answer token: (outputs, traces), a
    GreedyTrace (optladder/quality/near_tie.py) per prompt, None where there was no room to answer, and None; a
    server that refuses or omits `logprobs`: (outputs, all None, why): the check is then unavailable."""
    from optladder.quality.near_tie import GreedyTrace

    url = base_url.rstrip("/") + "/v1/completions"
    room = [max_new_tokens if max_model_len is None else min(max_new_tokens, max_model_len - len(p)) for p in prompts]
    outputs, traces = [""] * len(prompts), [None] * len(prompts)
    keep = [i for i, r in enumerate(room) if r >= 1]

    def one(i: int):
        body = {"model": model, "prompt": prompts[i], "max_tokens": room[i], "temperature": 0.0, "stream": False,
                "logprobs": top_k, "return_tokens_as_token_ids": True}
        resp = post_json(url, body, api_key, timeout_s)
        try:
            choice = resp["choices"][0]
            text = choice["text"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"POST {url}: no choices[0].text in the answer: {str(resp)[:300]}") from None
        lp = choice.get("logprobs") or {}
        tokens, top = lp.get("tokens"), lp.get("top_logprobs")
        if not tokens or not top or len(tokens) != len(top) or any(row is None for row in top):
            return i, text, None
        rows = [sorted(((_token(t), float(v)) for t, v in row.items()), key=lambda x: -x[1]) for row in top]
        return i, text, GreedyTrace([_token(t) for t in tokens], rows)

    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool, \
                tqdm(total=len(keep), desc="quality", unit="prompt", disable=not progress) as bar:
            for i, text, trace in pool.map(one, keep):
                outputs[i], traces[i] = text, trace
                bar.update(1)
    except EndpointError as e:
        if "logprobs" not in str(e):
            raise
        outputs = greedy_completions(base_url, model, prompts, max_new_tokens, max_model_len, concurrency, api_key,
                                     timeout_s, progress)
        return outputs, [None] * len(prompts), f"the server refused logprobs: {str(e)[:200]}"
    if any(traces[i] is None for i in keep):
        return outputs, [None] * len(prompts), "the server gave no top-k log-probs with its answers"
    return outputs, traces, None
