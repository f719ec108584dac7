"""The engine on its own thread (optladder/serving/engine_loop.py), fed from many threads, with the tiny real engine:
each caller gets its own tokens in order, a refused request does not stop the others, and when the loop ends
every waiting caller hears why instead of hanging."""
from __future__ import annotations

import queue
import threading

import pytest

from optladder.engine.sequence import SamplingParams
from optladder.serving.engine_loop import EngineDead, EngineLoop
from tests.test_server import MAX_LEN, tiny_engine


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


PROMPTS = {f"req-{i}": [7 + i] * (5 + 3 * i) for i in range(6)}


def stream(loop: EngineLoop, rid: str, prompt: list[int], params: SamplingParams):
    """What an HTTP handler does: submit with an outbox of its own, then read it to the finished event; a
    refusal or the loop's end arrives there as an exception (submit itself raises once the loop is dead)."""
    out: queue.Queue = queue.Queue()
    loop.submit(rid, prompt, params, out)

    def events():
        while True:
            item = out.get(timeout=60)
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return

    return events()


@pytest.fixture(scope="module")
def engine():
    """One engine for the tests whose loops end cleanly (a stopped loop leaves it idle for the next)."""
    return tiny_engine()


@pytest.fixture(scope="module")
def reference_tokens(engine):
    """The same greedy requests run by the engine alone, on this thread: what the loop must reproduce."""
    seqs = engine.generate(list(PROMPTS.values()), [greedy(4 + i) for i in range(len(PROMPTS))])
    return {rid: s.token_ids[s.num_prompt_tokens:] for rid, s in zip(PROMPTS, seqs)}


def test_concurrent_callers_each_get_their_own_tokens_in_order(engine, reference_tokens):
    loop = EngineLoop(engine)
    got: dict[str, list] = {}

    def call(i: int, rid: str) -> None:
        got[rid] = list(stream(loop, rid, PROMPTS[rid], greedy(4 + i)))

    threads = [threading.Thread(target=call, args=(i, rid)) for i, rid in enumerate(PROMPTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    loop.stop()
    for i, rid in enumerate(PROMPTS):
        events = got[rid]
        assert [e.request_id for e in events] == [rid] * (4 + i)
        assert [e.finished for e in events] == [False] * (3 + i) + [True]
        assert [e.token_id for e in events] == reference_tokens[rid]


def test_a_refused_request_raises_for_its_caller_only(engine):
    loop = EngineLoop(engine)
    too_long = stream(loop, "long", [3] * (MAX_LEN + 1), greedy(2))
    fine = stream(loop, "fine", [3] * 8, greedy(3))
    with pytest.raises(ValueError):
        next(too_long)
    assert len(list(fine)) == 3
    loop.stop()


class DiesOnStep:
    """A real engine whose device is lost at its second step."""

    def __init__(self):
        self.engine, self.steps = tiny_engine(), 0

    def step(self):
        self.steps += 1
        if self.steps == 2:
            raise RuntimeError("device lost")
        return self.engine.step()

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_when_the_engine_dies_every_caller_hears_why_and_later_submits_are_refused():
    loop = EngineLoop(DiesOnStep())
    events = stream(loop, "a", [3] * 8, greedy(10))
    with pytest.raises(EngineDead, match="device lost"):
        list(events)
    loop.thread.join(10)
    assert "device lost" in loop.dead
    with pytest.raises(EngineDead, match="device lost"):
        stream(loop, "b", [3] * 8, greedy(2))


def test_stop_ends_the_loop_and_refuses_what_comes_after(engine):
    loop = EngineLoop(engine)
    assert len(list(stream(loop, "a", [3] * 8, greedy(2)))) == 2
    loop.stop()
    assert not loop.thread.is_alive() and loop.dead == "server shut down"
    with pytest.raises(EngineDead, match="shut down"):
        stream(loop, "b", [3] * 8, greedy(2))
