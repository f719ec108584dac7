"""An engine under test, seen from an experiment: replay requests, generate quality outputs, report
memory, stage timings and which opts were really in effect. One class per engine; `make_backend` picks.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Protocol

from tqdm import tqdm

from optladder.backends.faults import FaultConfig, FaultyEngine
from optladder.backends.profiling import ProfiledEngine
from optladder.engine.config import ENGINES, EngineConfig, ModelConfig
from optladder.engine.sequence import SamplingParams
from optladder.quality.teacher_forced import TokenLogprobs
from optladder.traffic.replay import InProcessDriver
from optladder.traffic.replay_config import DRIVERS, Pacing, ReplayConfig
from optladder.traffic.request import Request, RequestRecord


class Backend(Protocol):
    name: str
    tokenizer: object
    load_s: float
    start_s: float

    def wait_ready(self) -> None: ...  # a server launched with make_backend(..., wait=False): until it answers
    def warmup(self, requests: list[Request]) -> None: ...
    def replay(self, requests: list[Request], cfg: ReplayConfig, pacing: Pacing,
               on_record: Callable[[RequestRecord], None]) -> list[RequestRecord]: ...
    def generate(self, prompts: list[list[int]], max_new_tokens: int, progress: bool) -> list[str]: ...
    def metrics(self) -> dict[str, float]: ...
    def opts_effective(self) -> dict[str, dict]: ...
    def score(self, token_ids_list: list[list[int]], starts: list[int]) -> list[TokenLogprobs]: ...
    def close(self) -> None: ...


class ReferenceBackend:
    name = "reference"

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig, driver: str = "inprocess",
                 faults: FaultConfig | None = None):
        from optladder.engine.llm_engine import LLMEngine

        if driver not in DRIVERS:
            raise ValueError(f"replay.driver={driver!r} is not one of {list(DRIVERS)}")
        self.engine = LLMEngine(model_cfg, engine_cfg)
        # what the replay steps: the engine, or the engine with test-only faults (optladder/backends/faults.py)
        self.stepper = FaultyEngine(self.engine, faults) if faults is not None and faults.any else self.engine
        self.tokenizer = self.engine.tokenizer
        self.load_s, self.start_s = self.engine.load_s, self.engine.start_s
        self.max_model_len = engine_cfg.max_model_len
        # locust: the same engine behind optladder/serving/server.py, replayed over HTTP from another process
        self.driver = driver
        self.model_name, self.host, self.api_key = model_cfg.name, engine_cfg.server.host, engine_cfg.server.api_key
        self._profile = None

    def profile_next_replay(self, cfg, out_dir) -> None:
        """Record a torch profiler trace in the middle of the next replay (optladder/backends/profiling.py)."""
        self._profile = (cfg, out_dir)

    @staticmethod
    def _replay_params(r: Request) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=r.ignore_eos)

    def wait_ready(self) -> None:
        pass  # loaded in __init__

    def warmup(self, requests: list[Request]) -> None:
        """A few short requests so one-time costs (allocator, kernels, caches) stay out of the numbers."""
        if requests:
            self.engine.generate([r.prompt_token_ids for r in requests],
                                 [SamplingParams(max_tokens=min(4, r.output_len)) for r in requests])
        self.engine.reset_stats()

    def replay(self, requests, cfg, pacing, on_record):
        if self.driver == "locust":
            return self._replay_http(requests, cfg, pacing, on_record)
        return _replay_inprocess(self, self.stepper, requests, cfg, pacing, on_record)

    def _replay_http(self, requests, cfg, pacing, on_record):
        from optladder.serving.server import serve
        from optladder.traffic.http_driver import replay_http

        with serve(self.stepper, self.host, 0, model_name=self.model_name, api_key=self.api_key) as server:
            records = replay_http(requests, server.url, server.model, cfg, pacing, on_record, self.api_key)
            if server.loop.dead is not None:  # the engine raised: every client got a 503, the run failed
                raise RuntimeError(f"the engine failed mid-replay over HTTP: {server.loop.dead}")
            return records

    def generate(self, prompts, max_new_tokens, progress=True):
        """Greedy, stopping at EOS; a prompt that leaves no room to answer gets '' (counted by the caller)."""
        outputs = [""] * len(prompts)
        for i, seq in self._greedy(prompts, max_new_tokens, 0, progress):
            outputs[i] = seq.output_text
        return outputs

    def _greedy(self, prompts, max_new_tokens, logprobs, progress):
        """(prompt index, finished Sequence) of every prompt with room to answer, greedy to EOS."""
        room = [min(max_new_tokens, self.max_model_len - len(p)) for p in prompts]
        keep = [i for i, r in enumerate(room) if r >= 1]
        params = [SamplingParams(temperature=0.0, max_tokens=room[i], ignore_eos=False, logprobs=logprobs)
                  for i in keep]
        with tqdm(total=len(keep), desc="quality", unit="prompt", disable=not progress) as bar:
            seqs = self.engine.generate([prompts[i] for i in keep], params, progress=bar)
        return list(zip(keep, seqs))

    def generate_traced(self, prompts, max_new_tokens, top_k, progress=True):
        """(outputs, traces, None): as generate, and per prompt a GreedyTrace (optladder/quality/near_tie.py), the
        top_k log-probs recorded at every output position by the decode path itself (its batches, chunks, graphs and
        drafts); None where a prompt left no room to answer. The third item, why no traces, is None here."""
        from optladder.quality.near_tie import GreedyTrace

        outputs, traces = [""] * len(prompts), [None] * len(prompts)
        for i, seq in self._greedy(prompts, max_new_tokens, top_k, progress):
            outputs[i] = seq.output_text
            traces[i] = GreedyTrace(list(seq.output_token_ids), [list(zip(a, b)) for a, b in seq.top_logprobs])
        return outputs, traces, None

    def metrics(self):
        return {**self.engine.memory_metrics(), **self.engine.stage_metrics()}

    def kv_timeline(self):
        return self.engine.kv_timeline.points

    def opts_effective(self):
        return self.engine.opts_effective()

    def score(self, token_ids_list: list[list[int]], starts: list[int]) -> list[TokenLogprobs]:
        """Teacher forcing: the full next-token distribution at every position from start on."""
        # on a GPU they stay there and are compared there (optladder/quality/teacher_forced.py); on the CPU numpy is faster
        if self.engine.device.type == "cuda":
            lps = self.engine.score(token_ids_list, starts, on_device=True)
            return [TokenLogprobs.from_tensor(lp, ids[st:]) for lp, ids, st in zip(lps, token_ids_list, starts)]
        lps = self.engine.score(token_ids_list, starts)
        return [TokenLogprobs.from_full(lp.numpy(), ids[st:]) for lp, ids, st in zip(lps, token_ids_list, starts)]

    def close(self) -> None:
        self.engine = self.stepper = None


class HFBackend:
    """transformers in this process (optladder/backends/hf.py), replayed by the same in-process driver."""

    name = "hf"

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig, driver: str = "inprocess"):
        from optladder.backends.hf import HFEngine

        if driver != "inprocess":
            raise ValueError(f"replay.driver={driver!r}: engine=hf runs in this process and has no server; "
                             "valid: ['inprocess']")
        self.engine = HFEngine(model_cfg, engine_cfg)
        self.tokenizer = self.engine.tokenizer
        self.load_s, self.start_s = self.engine.load_s, self.engine.start_s
        self._profile = None

    def wait_ready(self) -> None:
        pass  # loaded in __init__

    def warmup(self, requests: list[Request]) -> None:
        if requests:
            self.engine.generate([r.prompt_token_ids for r in requests], 4)
        self.engine.reset_stats()

    def replay(self, requests, cfg, pacing, on_record):
        return _replay_inprocess(self, self.engine, requests, cfg, pacing, on_record)

    def profile_next_replay(self, cfg, out_dir) -> None:
        self._profile = (cfg, out_dir)

    def generate(self, prompts, max_new_tokens, progress=True):
        with tqdm(total=len(prompts), desc="quality", unit="prompt", disable=not progress) as bar:
            return self.engine.generate(prompts, max_new_tokens, progress=bar)

    def generate_traced(self, prompts, max_new_tokens, top_k, progress=True):
        """As generate, with a GreedyTrace per prompt. transformers' batched generate gives no per-step scores in
        continuous batching, so the top-k here come from a teacher-forced pass of this model over its own answer
        (one forward a prompt): the tokens are the decode path's, the distributions an unbatched forward's, so only
        the control's side of a fork and the drift see what the decode path computed."""
        from optladder.quality.near_tie import GreedyTrace

        with tqdm(total=len(prompts), desc="quality", unit="prompt", disable=not progress) as bar:
            texts, tokens = self.engine.generate(prompts, max_new_tokens, progress=bar, with_tokens=True)
        traces = [None] * len(prompts)
        for i in (i for i, t in enumerate(tokens) if t):  # one at a time: a full [len, vocab] array each
            lp = self.engine.score([list(prompts[i]) + tokens[i]], [len(prompts[i])])[0]
            top = TokenLogprobs.from_full(lp, tokens[i]).topk(min(top_k, lp.shape[-1]))
            traces[i] = GreedyTrace(tokens[i], [list(zip(a.tolist(), b.tolist())) for a, b in zip(*top)])
        return texts, traces, None

    def metrics(self):
        return self.engine.memory_metrics()

    def opts_effective(self):
        return self.engine.opts_effective()

    def score(self, token_ids_list: list[list[int]], starts: list[int]) -> list[TokenLogprobs]:
        lps = self.engine.score(token_ids_list, starts)
        return [TokenLogprobs.from_full(lp, ids[st:]) for lp, ids, st in zip(lps, token_ids_list, starts)]

    def close(self) -> None:
        self.engine.close()


def _replay_inprocess(backend, engine, requests, cfg, pacing, on_record):
    """The in-process driver over `engine` (the backend's, or it with test-only faults), wrapped by the profiler
    when one is armed."""
    armed, backend._profile = backend._profile, None
    if armed is not None:
        engine = ProfiledEngine(engine, armed[0], len(requests) // 2 + 1, armed[1])
    try:
        return InProcessDriver(engine, ReferenceBackend._replay_params, on_record).replay(requests, cfg, pacing)
    finally:
        if armed is not None:
            engine.finish()  # a replay shorter than the profiled steps still leaves its trace


class _HttpBackend:
    """An engine behind an OpenAI-compatible endpoint: replayed by the locust driver whatever replay.driver
    says (there is no in-process path), quality over /v1/completions with our chat template's token ids."""

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig):
        from optladder.engine.loader import load_tokenizer

        t0 = time.perf_counter()
        self.tokenizer = load_tokenizer(model_cfg)
        self.load_s = time.perf_counter() - t0
        self.concurrency = engine_cfg.max_num_seqs  # quality requests in flight: as many as the server batches
        self.api_key = engine_cfg.server.api_key
        self._metrics: dict[str, float] = {}

    def wait_ready(self) -> None:
        pass  # started in __init__ (VLLMBackend overrides it)

    def warmup(self, requests: list[Request]) -> None:
        if requests:
            self.server.generate([r.prompt_token_ids for r in requests], 4, self.concurrency, progress=False)

    def _replay(self, requests, cfg, pacing, on_record):
        from optladder.traffic.http_driver import replay_http

        return replay_http(requests, self.server.url, self.server.model, cfg, pacing, on_record, self.api_key)

    def replay(self, requests, cfg, pacing, on_record):
        return self._replay(requests, cfg, pacing, on_record)

    def generate(self, prompts, max_new_tokens, progress=True):
        return self.server.generate(prompts, max_new_tokens, concurrency=self.concurrency, progress=progress)

    def generate_traced(self, prompts, max_new_tokens, top_k, progress=True):
        """As generate, with the server's own top-k log-probs of every answer token (`logprobs` of /v1/completions;
        vLLM gives token ids, any other server token strings); traces all None, and why, where it offers none."""
        from optladder.backends.completions import greedy_traced

        return greedy_traced(self.server.url, self.server.model, prompts, max_new_tokens, self.server.max_model_len,
                             top_k, self.concurrency, self.api_key, progress=progress)

    def metrics(self):
        return dict(self._metrics)

    def opts_effective(self):
        return self.server.opts_effective()

    def score(self, token_ids_list: list[list[int]], starts: list[int]) -> list[TokenLogprobs]:
        """Top-k log-probs only (optladder/backends/scoring.py): the KL built on them is approximate."""
        from optladder.backends.scoring import prompt_logprobs

        return prompt_logprobs(self.server.url, self.server.model, token_ids_list, starts, self.api_key,
                               concurrency=self.concurrency)


class VLLMBackend(_HttpBackend):
    """`vllm serve` started for this run and stopped with it (optladder/backends/vllm_server.py)."""

    name = "vllm"

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig, log_dir: Path | None = None,
                 wait: bool = True):
        from optladder.backends.vllm_server import VLLMServer

        super().__init__(model_cfg, engine_cfg)
        # log_dir: the run's, so a failed start leaves it there; wait=False: launched, wait_ready() awaits it
        self.server = VLLMServer(model_cfg, engine_cfg, log_dir, wait=wait)
        self.start_s = self.server.start_s

    def wait_ready(self) -> None:
        self.server.wait_ready()
        self.start_s = self.server.start_s

    def replay(self, requests, cfg, pacing, on_record):
        try:
            with self.server.measure() as probe:  # vLLM's own counters, before and after, and its KV gauge during
                records = self._replay(requests, cfg, pacing, on_record)
        except Exception:
            self.server.check_alive()  # a server that died is the news, not the scrape that found it gone
            raise
        self.server.check_alive()  # killed mid-replay: every request after failed fast, and the run fails
        self._metrics = probe.metrics
        return records

    def close(self) -> None:
        self.server.close()


class OpenAIBackend(_HttpBackend):
    """Any OpenAI-compatible endpoint (optladder/backends/openai_endpoint.py); its opts are metadata only."""

    name = "openai"

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig):
        from optladder.backends.openai_endpoint import OpenAIEndpoint

        super().__init__(model_cfg, engine_cfg)
        self.server = OpenAIEndpoint(model_cfg, engine_cfg)
        self.start_s = self.server.start_s

    def close(self) -> None:
        pass  # not ours to stop


def make_backend(model_cfg: ModelConfig, engine_cfg: EngineConfig, driver: str = "inprocess",
                 faults: FaultConfig | None = None, log_dir: Path | None = None, wait: bool = True) -> Backend:
    """log_dir: where a server-backed engine (vllm) writes its server's log, e.g. the run directory (None: a
    temporary directory, named in the log and in the error of a server that fails to start). wait=False: a
    server-backed engine is launched and not awaited, so that several start at once; call wait_ready() before
    using it (the in-process engines are loaded either way)."""
    name = engine_cfg.name
    tp = engine_cfg.server.tensor_parallel_size
    if tp != 1 and name != "vllm":
        raise ValueError(f"engine.server.tensor_parallel_size={tp}: tensor parallelism runs through engine=vllm "
                         f"only; engine={name} runs the model on one device (set it to 1)")
    if model_cfg.damage and name in ("vllm", "openai"):
        raise ValueError(f"model.damage={model_cfg.damage!r} is applied to weights this process loads; engine={name} "
                         "loads its own: use engine=reference or engine=hf")
    if name == "reference":
        return ReferenceBackend(model_cfg, engine_cfg, driver, faults)
    if faults is not None and faults.any:
        raise ValueError(f"faults.* are injected into the reference engine's step; engine.name={name!r} has "
                         "none: leave faults at their defaults or use engine=reference")
    if name == "hf":
        return HFBackend(model_cfg, engine_cfg, driver)
    if name == "vllm":
        return VLLMBackend(model_cfg, engine_cfg, log_dir, wait=wait)
    if name == "openai":
        return OpenAIBackend(model_cfg, engine_cfg)
    raise ValueError(f"engine.name={name!r} is not one of {list(ENGINES)}")
