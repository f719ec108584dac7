"""The in-process driver on the tiny model: timing fidelity, closed-loop concurrency, rejection, failure."""
import pytest

from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.llm_engine import LLMEngine
from optladder.engine.sequence import SamplingParams
from optladder.traffic.replay import InProcessDriver
from optladder.traffic.replay_config import Pacing, ReplayConfig
from optladder.traffic.request import Request

TINY = ModelConfig(name="tiny", source="random", tokenizer="smollm2", hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=4096)
QUIET = ReplayConfig(progress=False)


def params(r: Request) -> SamplingParams:
    return SamplingParams(max_tokens=r.output_len, ignore_eos=True)


def reqs(n, gap=0.02, out=5, inp=12):
    return [Request(f"r{i}", list(range(100, 100 + inp)), out, scheduled_at=i * gap) for i in range(n)]


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(TINY, EngineConfig(kv_cache_gb=0.02, max_model_len=256, dynamic_batching=True))


def test_open_loop_keeps_the_schedule_and_exact_lengths(engine):
    records = InProcessDriver(engine, params).replay(reqs(10), QUIET, Pacing("open"))
    assert all(r.ok and r.output_tokens == 5 and len(r.token_times) == 5 for r in records)
    assert max(r.lateness for r in records) < 0.05
    assert all(r.sent_at >= r.scheduled_at for r in records)
    assert all(r.first_token_at >= r.sent_at and r.finished_at >= r.first_token_at for r in records)


def test_closed_loop_never_exceeds_its_concurrency(engine):
    records = InProcessDriver(engine, params).replay(reqs(12, out=8), QUIET, Pacing("closed", 3))
    assert all(r.ok for r in records)
    events = sorted([(r.sent_at, 1) for r in records] + [(r.finished_at, -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    in_flight = peak = 0
    for _, d in events:
        in_flight += d
        peak = max(peak, in_flight)
    assert peak == 3


def test_too_long_prompt_is_rejected_and_counted_not_truncated(engine):
    rs = reqs(3)
    rs[1] = Request("long", list(range(300)), 5, scheduled_at=0.02)
    seen = []
    records = InProcessDriver(engine, params, on_record=seen.append).replay(rs, QUIET, Pacing("open"))
    bad = [r for r in records if not r.ok]
    assert [r.id for r in bad] == ["long"] and bad[0].error.startswith("rejected")
    assert bad[0].output_tokens == 0
    assert len(seen) == 3  # every request, rejected ones too, reaches requests.jsonl


def test_static_batching_holds_a_lone_request_until_the_timeout():
    eng = LLMEngine(TINY, EngineConfig(kv_cache_gb=0.02, max_model_len=256, batch_size=4, batch_timeout_ms=120))
    records = InProcessDriver(eng, params).replay(reqs(1), QUIET, Pacing("open"))
    assert records[0].ttft >= 0.12


class DiesAfter(LLMEngine):
    """A real engine that crashes once a request has finished, as a driver would meet a device error."""

    finished = 0

    def step(self):
        if self.finished >= 1:
            raise RuntimeError("device lost")
        events = super().step()
        self.finished += sum(e.finished for e in events)
        return events


def test_engine_failure_keeps_finished_records_and_marks_the_rest():
    eng = DiesAfter(TINY, EngineConfig(kv_cache_gb=0.02, max_model_len=256, dynamic_batching=True))
    seen = []
    # the first request is short and the rest long, so however slow the machine some finish and some do not
    rs = [Request(r.id, r.prompt_token_ids, 2 if i == 0 else 24, r.scheduled_at) for i, r in enumerate(reqs(8))]
    with pytest.raises(RuntimeError, match="device lost"):
        InProcessDriver(eng, params, on_record=seen.append).replay(rs, QUIET, Pacing("open"))
    done = [r for r in seen if r.ok]
    failed = [r for r in seen if not r.ok]
    assert done and failed and len(done) + len(failed) == 8
    assert all("device lost" in r.error for r in failed)


def test_a_stop_from_on_record_aborts_the_rest_and_leaves_the_engine_clean(engine):
    from optladder.traffic.replay import StopReplay

    seen = []

    def on_record(rec):
        seen.append(rec.id)
        if len(seen) == 3:
            raise StopReplay("decided")

    free_before = engine.block_manager.num_free_blocks
    records = InProcessDriver(engine, params, on_record=on_record).replay(reqs(12, out=20), QUIET, Pacing("closed", 3))
    ok = [r for r in records if r.ok]
    stopped = [r for r in records if not r.ok]
    assert len(ok) >= 3 and stopped and len(ok) + len(stopped) == 12
    assert all(r.error == "stopped: decided" for r in stopped)
    assert sorted(seen) == sorted(r.id for r in records)  # every record still reaches on_record once
    assert not engine.has_unfinished() and engine.block_manager.num_free_blocks == free_before
    again = InProcessDriver(engine, params).replay(reqs(4), QUIET, Pacing("open"))  # the engine serves on
    assert all(r.ok and r.output_tokens == 5 for r in again)


def test_an_engine_without_abort_is_replayed_to_the_end_despite_a_stop(engine):
    from optladder.traffic.replay import StopReplay

    class NoAbort:  # what the driver needs, and no abort_request
        def __init__(self, e):
            self.add_request, self.step, self.has_unfinished, self.next_deadline = (
                e.add_request, e.step, e.has_unfinished, e.next_deadline)

    def on_record(rec):
        raise StopReplay("decided")

    records = InProcessDriver(NoAbort(engine), params, on_record=on_record).replay(reqs(5), QUIET, Pacing("open"))
    assert all(r.ok for r in records)


def test_an_engine_failure_under_a_stopping_callback_is_still_the_error_raised():
    # stop_when_missed raises at the first failed record; while the driver reports the engine's failure that
    # must neither replace the engine's error nor leave records unreported
    from optladder.traffic.capacity import stop_when_missed

    eng = DiesAfter(TINY, EngineConfig(kv_cache_gb=0.02, max_model_len=256, dynamic_batching=True))
    seen = []
    stop = stop_when_missed(8, 3.0)

    def on_record(rec):
        seen.append(rec)
        stop(rec)

    rs = [Request(r.id, r.prompt_token_ids, 2 if i == 0 else 24, r.scheduled_at) for i, r in enumerate(reqs(8))]
    with pytest.raises(RuntimeError, match="device lost"):
        InProcessDriver(eng, params, on_record=on_record).replay(rs, QUIET, Pacing("open"))
    assert len(seen) == 8 and all(r.ok or "device lost" in r.error for r in seen)


def test_an_open_loop_replay_stops_too_and_unsent_requests_fail(engine):
    from optladder.traffic.replay import StopReplay

    def on_record(rec):
        raise StopReplay("decided")

    free_before = engine.block_manager.num_free_blocks
    # the first request is due at once, the rest seconds later: the stop comes before they are sent
    rs = [Request(r.id, r.prompt_token_ids, r.output_len, 0.0 if i == 0 else 5.0 + i) for i, r in enumerate(reqs(6))]
    records = InProcessDriver(engine, params, on_record=on_record).replay(rs, QUIET, Pacing("open"))
    assert records[0].ok and all(r.error == "stopped: decided" and r.sent_at is None for r in records[1:])
    assert not engine.has_unfinished() and engine.block_manager.num_free_blocks == free_before


class _LateWaker:
    """The replay module's `time`, but a sleep that returns EXTRA_S late, as on an overloaded host: every
    request is sent late, and when each sender woke is kept to bound how late."""

    EXTRA_S = 0.15

    def __init__(self):
        import time as real

        self.real, self.woke = real, []
        self.monotonic = real.monotonic

    def sleep(self, s):
        self.real.sleep(s + self.EXTRA_S)
        self.woke.append(self.real.monotonic())


def test_sent_at_is_when_the_request_was_really_sent(engine, monkeypatch):
    """lateness = sent_at - scheduled_at is measured, not assumed: a sender that wakes late shows it."""
    import optladder.traffic.replay as replay

    clock = _LateWaker()
    monkeypatch.setattr(replay, "time", clock)
    driver = InProcessDriver(engine, params)
    schedule = [Request(f"r{i}", list(range(100, 112)), 2, scheduled_at=0.05 + 0.3 * i) for i in range(3)]
    records = driver.replay(schedule, QUIET, Pacing("open"))
    assert all(r.ok for r in records) and len(clock.woke) == 3  # each send waited for its time, and woke late
    for rec, woke in zip(records, clock.woke):
        assert rec.sent_at >= woke - driver.t0  # stamped after the sender woke, not at its scheduled time
        assert rec.lateness >= woke - driver.t0 - rec.scheduled_at >= 0.9 * clock.EXTRA_S
