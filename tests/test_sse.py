"""The client side of a streamed completion (optladder/traffic/sse.py): the exact request body, and how the event
stream's lines become a request's record, errors and cut streams included."""
from __future__ import annotations

import re

import pytest

from optladder.traffic.request import RequestRecord
from optladder.traffic.sse import TokenStream, completion_payload

REQ = {"id": "r1", "prompt_token_ids": [9, 8, 7], "output_len": 5, "prompt": "hi there", "ignore_eos": True}


def test_the_completions_body_asks_for_exactly_the_recorded_length_greedily():
    assert completion_payload(REQ, "tiny", chat=False) == {
        "model": "tiny", "max_tokens": 5, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True, "min_tokens": 5, "prompt": [9, 8, 7]}
    free = completion_payload({**REQ, "ignore_eos": False}, "tiny", chat=True)
    assert free == {"model": "tiny", "max_tokens": 5, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": False,
                    "messages": [{"role": "user", "content": "hi there"}]}


def test_chat_without_text_is_refused_naming_the_request():
    with pytest.raises(ValueError, match=re.escape("request r1: the chat endpoint needs prompt text, and it has "
                                                   "only token ids")):
        completion_payload({**REQ, "prompt": None}, "tiny", chat=True)


def stream(lines, chat=False):
    ticks = iter(range(1, 100))
    s = TokenStream(chat=chat, clock=lambda: next(ticks) / 10)
    for line in lines:
        s.feed(line)
    rec = RequestRecord("r1", 0.0, 3, 5, sent_at=0.0)
    s.fill(rec)
    return s, rec


def test_a_fresh_stream_has_nothing_yet():
    s = TokenStream(chat=False, clock=lambda: 0.0)
    assert (s.token_times, s.texts, s.usage, s.done, s.error, s.finished_at) == ([], [], None, False, None, None)


def test_data_lines_without_a_space_count_too():
    s, rec = stream([b'data:{"choices":[{"text":"a"}]}', b'data: {"choices":[{"text":"b"}]}', b"data:[DONE]"])
    assert rec.ok and rec.output_text == "ab" and rec.token_times == [0.1, 0.2] and rec.finished_at == 0.3


@pytest.mark.parametrize("event, message", [(b'data: {"error": {"message": "KV cache full", "code": 503}}',
                                              "server error: KV cache full"),
                                             (b'data: {"error": {"code": 503}}', "server error: {'code': 503}"),
                                             (b'data: {"error": "overloaded"}', "server error: overloaded")])
def test_a_server_error_event_fails_the_request_with_its_message(event, message):
    s, rec = stream([b'data: {"choices":[{"text":"a"}]}', event, b"data: [DONE]"])
    assert not rec.ok and rec.error == message and rec.finished_at is None
    assert rec.token_times == [0.1] and rec.first_token_at == 0.1 and rec.output_tokens == 1


def test_a_stream_with_no_tokens_has_no_first_token():
    s, rec = stream([b"data: [DONE]"])
    assert rec.ok and rec.first_token_at is None and rec.token_times == [] and rec.output_tokens == 0
    assert rec.finished_at == 0.1


def test_the_record_keeps_its_own_copy_of_the_times():
    s, rec = stream([b'data: {"choices":[{"text":"a"}]}', b"data: [DONE]"])
    s.token_times.append(9.9)
    assert rec.token_times == [0.1]
