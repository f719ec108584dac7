"""The locust side of an HTTP replay, run as its own process by `optladder.traffic.http_driver.replay_http`:

    python -m optladder.traffic.locust_worker SPEC.json

Its own process because locust monkey-patches the standard library for gevent, which must never touch
the process that runs torch and the engine. SPEC.json holds the requests and the settings; every
finished request is written to stdout as one JSON line `{"record": {...}}` (a RequestRecord) the moment
it ends, with `{"heartbeat": n_left}` lines in between so the parent can tell a slow replay from a stuck one.

Locust headless, driven as a library: one Environment, a local runner, and users of `ReplayUser`.
Open loop: every user takes the next request of the shared schedule and sleeps until its time, so a
request is late (sent_at > scheduled_at) only when every user was busy or the client fell behind.
Closed loop: `concurrency` users each send the next request when their previous one has finished;
scheduled_at is when the user became free, so lateness is the client's own overhead there too.
Times are seconds on the monotonic clock from the moment every user is spawned.
"""
from gevent import monkey

monkey.patch_all()  # before anything imports socket or ssl

import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import deque  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402
from locust import HttpUser, constant, task  # noqa: E402
from locust.env import Environment  # noqa: E402
from locust.exception import StopUser  # noqa: E402

from optladder.traffic.request import RequestRecord  # noqa: E402
from optladder.traffic.sse import TokenStream, completion_payload  # noqa: E402

log = logging.getLogger("optladder.locust_worker")
CONNECT_TIMEOUT_S = 10.0
HEARTBEAT_S = 2.0


class Schedule:
    """The requests still to send, shared by every user, and where finished records go."""

    def __init__(self, spec: dict, out):
        self.spec = spec
        self.open = spec["mode"] == "open"
        reqs = spec["requests"]
        self.pending = deque(sorted(reqs, key=lambda r: r["scheduled_at"]) if self.open else reqs)
        self.left = len(reqs)
        self.out = out
        self.go, self.done = Event(), Event()
        self.t0 = 0.0
        self.unreachable: str | None = None  # set once a connection is refused: the server is gone
        self.gone = Event()  # wakes users sleeping until their request's time, once the server is gone

    def start(self, **_) -> None:
        self.t0 = time.monotonic()
        self.go.set()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def emit(self, rec: RequestRecord) -> None:
        self.out.write(json.dumps({"record": json.loads(rec.to_json())}) + "\n")
        self.out.flush()
        self.left -= 1
        if self.left == 0:
            self.done.set()


class ReplayUser(HttpUser):
    wait_time = constant(0)
    schedule: Schedule  # set by main() before the runner starts

    @task
    def replay_next(self) -> None:
        s = self.schedule
        s.go.wait()
        if not s.pending:
            raise StopUser()
        r = s.pending.popleft()
        rec = RequestRecord(r["id"], r["scheduled_at"] if s.open else s.now(), len(r["prompt_token_ids"]),
                            r["output_len"])
        try:
            if s.open:
                s.gone.wait(timeout=max(0.0, s.t0 + rec.scheduled_at - time.monotonic()))
            if s.unreachable:  # fail fast: waiting out the schedule against a dead server helps no one
                rec.error = f"not sent: server unreachable ({s.unreachable})"
            else:
                self._send(r, rec)
        except gevent.GreenletExit:
            rec.error = rec.error or "replay stopped"
            raise
        except Exception as e:  # noqa: BLE001 - any failure is this request's error, never a lost record
            rec.ok, rec.error = False, f"client error: {e!r}"
        finally:
            s.emit(rec)

    def _send(self, r: dict, rec: RequestRecord) -> None:
        s, spec = self.schedule, self.schedule.spec
        chat = spec["endpoint"] == "chat"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        payload = completion_payload(r, spec["model"], chat)
        stream = TokenStream(chat, s.now)
        rec.sent_at = s.now()
        timer = gevent.Timeout(spec["request_timeout_s"])
        timer.start()
        try:
            headers = {"Authorization": f"Bearer {spec['api_key']}"} if spec.get("api_key") else None
            resp = self.client.post(path, json=payload, stream=True, name=path, headers=headers,
                                    timeout=(CONNECT_TIMEOUT_S, spec["request_timeout_s"]))
            if resp.error is not None or resp.status_code != 200:
                rec.error = _http_error(resp)
                if resp.error is not None and "refused" in str(resp.error).lower():
                    s.unreachable = rec.error
                    s.gone.set()
                return
            try:
                for line in resp.iter_lines():  # read past [DONE] to the body's end: the connection is reused
                    stream.feed(line)
                    if stream.error:
                        break
            finally:
                resp.close()
        except gevent.Timeout as t:
            if t is not timer:
                raise
            if not stream.done:  # a server that holds the stream open after [DONE] still answered in full
                stream.error = f"timeout: no complete response within {spec['request_timeout_s']} s"
        except Exception as e:  # noqa: BLE001 - a connection cut mid-stream: the server died
            stream.error = f"stream broken after {len(stream.token_times)} tokens: {e!r}"
        finally:
            timer.cancel()
        counted = (stream.usage or {}).get("prompt_tokens")
        if not chat and counted is not None and counted != rec.input_tokens and stream.error is None:
            # the replay promised the trace's lengths; a server that re-tokenized or added tokens broke it
            stream.error = f"the server counted {counted} prompt tokens, not the {rec.input_tokens} sent"
        stream.fill(rec)


def _http_error(resp) -> str:
    if resp.error is not None:
        return f"connection failed: {resp.error!r}"
    try:
        message = resp.json()["error"]["message"]
    except Exception:  # noqa: BLE001 - a non-OpenAI error body: keep what there is
        message = resp.text[:300]
    return f"HTTP {resp.status_code}: {message}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m optladder.traffic.locust_worker SPEC.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        spec = json.load(f)
    out = os.fdopen(os.dup(1), "w")  # records own the real stdout; anything else printed goes to stderr
    os.dup2(2, 1)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("locust").setLevel(logging.ERROR)  # e.g. its warning about our high spawn rate
    schedule = Schedule(spec, out)
    if schedule.left == 0:
        return 0
    ReplayUser.schedule = schedule
    env = Environment(user_classes=[ReplayUser], host=spec["base_url"])
    env.events.spawning_complete.add_listener(schedule.start)  # t0 after spawning: no ramp-up lateness
    runner = env.create_local_runner()
    n = min(schedule.left, spec["max_users"] if schedule.open else spec["concurrency"])
    runner.start(n, spawn_rate=n)
    gevent.spawn(_heartbeat, schedule)
    schedule.done.wait()
    runner.quit()
    return 0


def _heartbeat(schedule: Schedule) -> None:
    while not schedule.done.is_set():
        schedule.out.write(json.dumps({"heartbeat": schedule.left}) + "\n")
        schedule.out.flush()
        gevent.sleep(HEARTBEAT_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
