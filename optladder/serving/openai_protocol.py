"""The OpenAI completions wire format, as the reference server speaks it: request bodies in (validated,
turned into token ids and SamplingParams), response and stream-chunk bodies out. No I/O, no threads.

Follows vLLM where OpenAI is silent: `ignore_eos`, `min_tokens`, `top_k` are accepted, and `prompt` may
be a list of token ids, the only way a replay can send a prompt of an exact length.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from optladder.engine.sequence import SamplingParams

# fields that change the output and that the reference engine cannot honour, with the value that is
# harmless; anything else in them is refused rather than ignored
_UNSUPPORTED = {"n": (None, 1), "best_of": (None, 1), "stop": (None, [], ""), "logprobs": (None, False),
                "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
                "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
                "repetition_penalty": (None, 1, 1.0), "stop_token_ids": (None, [])}


class BadRequest(ValueError):
    """The client's fault: answered with HTTP 400 and this message."""


@dataclass
class Completion:
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    chat: bool


def parse_completion(body: dict, tokenizer, max_model_len: int, vocab_size: int) -> Completion:
    """POST /v1/completions: `prompt` is text, a list of token ids, or a one-element list of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt))
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise BadRequest(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
        ids = list(prompt)
    else:
        raise BadRequest("prompt must be a string or a list of token ids (one prompt per request), "
                         f"got {type(prompt).__name__}")
    return _completion(body, ids, max_model_len, default_max_tokens=16, chat=False)


def parse_chat(body: dict, tokenizer, max_model_len: int, vocab_size: int) -> Completion:
    """POST /v1/chat/completions: `messages` through the tokenizer's chat template."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string role, got {m!r}")
        content = m.get("content")
        if isinstance(content, list):  # the parts form: only text parts can be served
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be text, got {type(content).__name__}")
        turns.append({"role": m["role"], "content": content})
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # transformers returns a BatchEncoding in some versions
        ids = ids["input_ids"]
    if "max_completion_tokens" in body and body.get("max_tokens") is None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    return _completion(body, list(ids), max_model_len, default_max_tokens=max_model_len - len(ids), chat=True)


def _completion(body: dict, ids: list[int], max_model_len: int, default_max_tokens: int,
                chat: bool) -> Completion:
    for name, harmless in _UNSUPPORTED.items():
        if body.get(name) not in harmless:
            raise BadRequest(f"{name}={body[name]!r} is not supported by the reference server; "
                             f"valid: {[v for v in harmless if v is not None]} or leave it out")
    if not ids:
        raise BadRequest("the prompt is empty")
    max_tokens = _number(body, "max_tokens", default_max_tokens, int)
    if max_tokens < 1 and len(ids) < max_model_len:  # a chat prompt that fills the context: said below
        raise BadRequest(f"max_tokens must be >= 1, got {max_tokens}")
    total = len(ids) + max(max_tokens, 1)
    if total > max_model_len:
        raise BadRequest(f"This model's maximum context length is {max_model_len} tokens. However, you "
                         f"requested {total} tokens ({len(ids)} in the prompt, {max_tokens} in the "
                         f"completion). Please reduce the length of the prompt or completion.")
    ignore_eos = _flag(body, "ignore_eos")
    min_tokens = _number(body, "min_tokens", 0, int)
    if not 0 <= min_tokens <= max_tokens:
        raise BadRequest(f"min_tokens={min_tokens} must be between 0 and max_tokens={max_tokens}")
    if 0 < min_tokens < max_tokens and not ignore_eos:
        # honouring it needs EOS masked until min_tokens, which the engine's sampler does not do
        raise BadRequest(f"min_tokens={min_tokens} < max_tokens={max_tokens} without ignore_eos is not "
                         "supported by the reference engine; send ignore_eos=true or min_tokens=max_tokens")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest(f"stream_options must be an object, got {opts!r}")
    try:
        params = SamplingParams(temperature=_number(body, "temperature", 1.0, float),
                                top_p=_number(body, "top_p", 1.0, float), top_k=max(0, _number(body, "top_k", 0, int)),
                                max_tokens=max_tokens, ignore_eos=ignore_eos or min_tokens == max_tokens,
                                seed=_number(body, "seed", None, int))
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return Completion(ids, params, _flag(body, "stream"), bool(opts.get("include_usage")), chat)


def _number(body: dict, key: str, default, kind: type):
    v = body.get(key)
    if v is None:
        return default
    # JSON allows 1e999 (inf) and NaN here: refused, not a 500 from int(inf)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (kind is int and v != int(v)):
        raise BadRequest(f"{key} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    return kind(v)


def _flag(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if not isinstance(v, bool):
        raise BadRequest(f"{key} must be true or false, got {v!r}")
    return v


# --- out ---
def chunk(rid: str, model: str, created: int, chat: bool, text: str | None, finish: str | None,
          role: bool = False, usage: dict | None = None) -> dict:
    """One SSE event body: a token's text, the chat role announcement, or (usage given) the usage tail."""
    if usage is not None:
        choices = []
    elif chat:
        delta = {"role": "assistant", "content": ""} if role else {"content": text}
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    out = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
           "model": model, "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


class TokenEvents:
    """The SSE event of each token of one stream, as bytes, equal to `data: json.dumps(chunk(...))`. The JSON
    around the text is built once per request, so a token costs one json.dumps of its own text: a stream
    is an event per token, and the server's CPU per token is taken from the engine's (one interpreter)."""

    _TEXT, _FINISH = "\ue000", "\ue001"  # private-use code points, escaped by json.dumps

    def __init__(self, rid: str, model: str, created: int, chat: bool):
        whole = json.dumps(chunk(rid, model, created, chat, self._TEXT, self._FINISH)).encode()
        text, finish = json.dumps(self._TEXT).encode(), json.dumps(self._FINISH).encode()
        head, rest = whole.split(text)
        mid, tail = rest.split(finish)
        self._head, self._mid, self._tail = b"data: " + head, mid, tail + b"\n\n"

    def event(self, text: str, finish: str | None) -> bytes:
        fin = b"null" if finish is None else json.dumps(finish).encode()
        return self._head + json.dumps(text).encode() + self._mid + fin + self._tail


def final_response(rid: str, model: str, created: int, chat: bool, text: str, finish: str | None,
                   usage: dict) -> dict:
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage}
