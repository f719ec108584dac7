"""The client side of an OpenAI-compatible streaming completion: the request body a replay sends, and
the parse of the server-sent events that come back, timing every token. Pure: no sockets, no gevent,
so the locust worker and the tests share one definition of when a token arrived.
"""
from __future__ import annotations

import json
from typing import Callable

from optladder.traffic.request import RequestRecord


def completion_payload(r: dict, model: str, chat: bool) -> dict:
    """The body for one replayed request (a `Request` as a dict).

    /v1/completions gets the prompt as token ids, so it keeps the trace's exact length (decoded text
    does not re-tokenize to the same length). /v1/chat/completions can only carry text: its prompt
    goes through the chat template, so lengths there are approximate. Exactly `output_len` tokens are
    asked for, as vLLM's benchmarks do: ignore_eos with min_tokens = max_tokens.
    """
    n = r["output_len"]
    body = {"model": model, "max_tokens": n, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": r["ignore_eos"]}
    if r["ignore_eos"]:
        body["min_tokens"] = n
    if chat:
        if not r.get("prompt"):
            raise ValueError(f"request {r['id']}: the chat endpoint needs prompt text, and it has only token ids")
        body["messages"] = [{"role": "user", "content": r["prompt"]}]
    else:
        body["prompt"] = r["prompt_token_ids"]
    return body


class TokenStream:
    """Feed it the lines of an SSE response; it keeps the time of every token chunk, the text, the
    usage and how the stream ended. `clock()` gives seconds since the replay's start.

    A chunk counts as a token when its choice carries a text field, even an empty one: a token whose
    bytes end mid-character decodes to "" and still took its step (the reference server sends one chunk
    per token). Chat's opening chunk only announces the role and is not a token. Output tokens come from
    the usage tail when the server sends one (vLLM merges or skips chunks), else from the chunk count.
    """

    def __init__(self, chat: bool, clock: Callable[[], float]):
        self.chat, self.clock = chat, clock
        self.token_times: list[float] = []
        self.texts: list[str] = []
        self.usage: dict | None = None
        self.done = False
        self.error: str | None = None
        self.finished_at: float | None = None

    def feed(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return  # blank separators, SSE comments, event names
        now = self.clock()  # before parsing: the token arrived when its line did
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done, self.finished_at = True, now
            return
        obj = json.loads(data)
        if obj.get("error"):
            err = obj["error"]
            self.error = f"server error: {err.get('message', err) if isinstance(err, dict) else err}"
            return
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            text = self._text(choice)
            if text is not None:
                self.token_times.append(now)
                self.texts.append(text)

    def _text(self, choice: dict) -> str | None:
        if not self.chat:
            return choice.get("text")
        delta = choice.get("delta") or {}
        return None if "role" in delta else delta.get("content")

    def fill(self, rec: RequestRecord) -> None:
        """Copy what arrived into `rec`; ok only for a stream that ended with [DONE] and no error."""
        rec.token_times = list(self.token_times)
        rec.first_token_at = self.token_times[0] if self.token_times else None
        rec.output_text = "".join(self.texts)
        rec.output_tokens = int(self.usage["completion_tokens"]) if self.usage else len(self.token_times)
        if self.error is None and not self.done:
            self.error = f"stream ended without [DONE] after {len(self.token_times)} tokens"
        rec.error = self.error
        rec.ok = self.error is None
        rec.finished_at = self.finished_at if rec.ok else None
