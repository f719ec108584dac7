"""The OpenAI wire format as the reference server speaks it (optladder/serving/openai_protocol.py), without a server:
what a request body turns into, what is refused and why, and the shape of what goes back."""
from __future__ import annotations

import pytest

from optladder.serving.openai_protocol import BadRequest, chunk, final_response, parse_chat, parse_completion

MAX_LEN, VOCAB = 64, 1000


class WordTokenizer:
    """One id per word (its length): enough to see which text went through which path."""

    def encode(self, text: str) -> list[int]:
        return [len(w) for w in text.split()]

    def apply_chat_template(self, turns, add_generation_prompt: bool, tokenize: bool) -> list[int]:
        ids = []
        for t in turns:
            ids += [900 if t["role"] == "user" else 901, *self.encode(t["content"])]
        return ids + ([902] if add_generation_prompt else [])


TOK = WordTokenizer()


def completion(**body):
    return parse_completion({"model": "tiny", **body}, TOK, MAX_LEN, VOCAB)


def test_token_id_prompts_are_kept_exactly_and_text_is_tokenized():
    assert completion(prompt=[5, 6, 7]).prompt_token_ids == [5, 6, 7]
    assert completion(prompt=[[5, 6, 7]]).prompt_token_ids == [5, 6, 7]  # a one-prompt batch
    assert completion(prompt="three word prompt").prompt_token_ids == [5, 4, 6]
    assert completion(prompt=["three word prompt"]).prompt_token_ids == [5, 4, 6]


def test_sampling_settings_reach_the_engine_params():
    c = completion(prompt=[1, 2], max_tokens=7, temperature=0.5, top_p=0.9, top_k=40, seed=3, stream=True,
                   stream_options={"include_usage": True})
    p = c.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed) == (7, 0.5, 0.9, 40, 3)
    assert c.stream and c.include_usage and not c.chat and not p.ignore_eos
    assert completion(prompt=[1, 2]).params.max_tokens == 16  # OpenAI's default for completions


@pytest.mark.parametrize("body, ignore_eos", [({"ignore_eos": True}, True), ({"min_tokens": 5}, True),
                                              ({}, False), ({"min_tokens": 0}, False)])
def test_exact_lengths_by_ignore_eos_or_min_tokens_equal_to_max(body, ignore_eos):
    assert completion(prompt=[1, 2], max_tokens=5, **body).params.ignore_eos is ignore_eos


@pytest.mark.parametrize("body, match", [
    ({"prompt": [1, VOCAB]}, r"\[1000\] are outside the vocabulary \[0, 1000\)"),
    ({"prompt": [1, -1]}, "outside the vocabulary"),
    ({"prompt": [True, 2]}, "string or a list of token ids"),
    ({"prompt": 12}, "got int"),
    ({"prompt": ""}, "empty"),
    ({"prompt": [1] * 60, "max_tokens": 5}, "maximum context length is 64 tokens. However, you requested 65 "
                                            r"tokens \(60 in the prompt, 5 in the completion\)"),
    ({"prompt": [1], "n": 2}, r"n=2 is not supported .*valid: \[1\]"),
    ({"prompt": [1], "stop": ["\n"]}, "stop="),
    ({"prompt": [1], "max_tokens": 4, "min_tokens": 2}, "without ignore_eos is not supported"),
    ({"prompt": [1], "max_tokens": 4, "min_tokens": 5}, "between 0 and max_tokens=4"),
    ({"prompt": [1], "max_tokens": True}, "max_tokens must be an integer, got True"),
    ({"prompt": [1], "max_tokens": 2.5}, "max_tokens must be an integer"),
    ({"prompt": [1], "temperature": "hot"}, "temperature must be a number"),
    ({"prompt": [1], "temperature": -1}, "temperature must be >= 0"),
    ({"prompt": [1], "stream": "yes"}, "stream must be true or false"),
    ({"prompt": [1], "stream_options": [1]}, "stream_options must be an object"),
])
def test_bad_requests_say_what_is_wrong(body, match):
    with pytest.raises(BadRequest, match=match):
        parse_completion(body, TOK, MAX_LEN, VOCAB)


def test_harmless_values_of_unsupported_fields_are_accepted():
    c = completion(prompt=[1], n=1, best_of=None, stop=[], logprobs=False, echo=False, presence_penalty=0)
    assert c.prompt_token_ids == [1]


def test_chat_goes_through_the_template_and_fills_the_context_by_default():
    c = parse_chat({"messages": [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": [{"type": "text", "text": "hi there"},
                                                              {"type": "image_url", "image_url": {}}]}]},
                   TOK, MAX_LEN, VOCAB)
    assert c.prompt_token_ids == [901, 2, 5, 900, 2, 5, 902] and c.chat
    assert c.params.max_tokens == MAX_LEN - 7
    c = parse_chat({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}, TOK, MAX_LEN,
                   VOCAB)
    assert c.params.max_tokens == 3


@pytest.mark.parametrize("messages, match", [(None, "non-empty list"), ([], "non-empty list"),
                                             (["hi"], r"messages\[0\] must be an object"),
                                             ([{"content": "hi"}], "string role"),
                                             ([{"role": "user", "content": 5}], r"messages\[0\].content must be text")])
def test_bad_chat_messages_are_refused(messages, match):
    with pytest.raises(BadRequest, match=match):
        parse_chat({"messages": messages}, TOK, MAX_LEN, VOCAB)


def test_stream_chunks_and_final_bodies_have_the_openai_shapes():
    c = chunk("id1", "tiny", 100, chat=False, text="Hi", finish=None)
    assert c == {"id": "id1", "object": "text_completion", "created": 100, "model": "tiny",
                 "choices": [{"index": 0, "text": "Hi", "logprobs": None, "finish_reason": None}]}
    role = chunk("id1", "tiny", 100, chat=True, text=None, finish=None, role=True)
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunk("id1", "tiny", 100, True, "x", "length")["choices"][0]["delta"] == {"content": "x"}
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    tail = chunk("id1", "tiny", 100, True, None, None, usage=usage)
    assert tail["choices"] == [] and tail["usage"] == usage
    whole = final_response("id1", "tiny", 100, chat=True, text="Hi!", finish="stop", usage=usage)
    assert whole["object"] == "chat.completion" and whole["usage"] == usage
    assert whole["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}, "logprobs": None,
                                 "finish_reason": "stop"}]
    assert final_response("id1", "tiny", 100, False, "Hi!", "length", usage)["choices"][0]["text"] == "Hi!"
