"""The reference engine with every GPU switch on (chunked prefill included) against vLLM on one GPU, under
real traffic: the Azure conversation trace replayed open loop, plus the batch-1 decode and burst measures.

Protocol (the same for both engines, each in its own child process, one after the other):
- model: Llama-3-8B's shape with a 49,152-token vocabulary, random bf16 weights (ours `source=random`,
  vLLM `load_format="dummy"`), identical token ids (seeded per request), greedy, EOS ignored, the recorded
  output lengths;
- replay: the first 500 requests of traces/azure_conv_2023.csv, inputs clipped to 4,096 tokens, sent at
  their own timestamps divided by a time scale (1, 4, 8); TTFT and E2E counted from the scheduled arrival;
  TPOT = (E2E − TTFT) / (output tokens − 1); output tok/s = output tokens / makespan;
- settings: KV budget 60 GiB, at most 256 sequences, 8,192 batched tokens a step, max_model_len 8,192,
  prefix caching off in both; vLLM through its AsyncLLM (torch.compile, CUDA graphs, chunked prefill, FA3);
- batch-1 decode: (time of a 256-token run − time of a 1-token run) / 255, median of 3; bursts: 64 × 1,000 →
  128 and 8 × 512 → 256 submitted at once.
Ours is also run without chunked_prefill at 4× (the ablation); every step's time and load are summarized
and logged, and a torch profiler table of 24 steps of a further 4× replay, from the step at which the last
measured 4× repeat was 15 s in (its busiest part), says where the step time goes. That replay is not counted.
Preparing the profiler's trace stalled the engine for seconds on the H200 (3.9-4.7 s), which backs the queue
up: the first 4× repeat was profiled mid-replay until 2026-12-02 (TTFT p99 3.5-3.9 s against 0.24 s in the
repeat after it), and a schedule that waited before warming up stalled the same way at its warmup step. So the
trace is now prepared before the replay starts (the profiler warms up from its first step) and records only
the chosen steps.
vLLM's steps are logged too, from its own per-iteration details (vLLM 0.26: `enable_logging_iteration_details`,
read by a stat logger passed to AsyncLLM): each iteration's prompt ("context") and decode ("generation") tokens and
when its outputs were recorded, so the two engines' steps can be read side by side (ours: each step's whole time;
vLLM's: the spacing of its records, its period under asynchronous scheduling; see VllmSteps).

    python3 benchmarks/gpu_serving_vs_vllm.py --requests FILE --out $OUT [--only ours|vllm] --tok-dir DIR
        [--scales 1,4,8] [--repeats 2] [--skip-bursts] [--skip-ablation]   (the last three: a shorter run)
    python3 benchmarks/gpu_serving_vs_vllm.py --make-requests CSV --requests FILE   (here: the trace rows)
    python3 benchmarks/gpu_serving_vs_vllm.py --combine A.json B.json --out DIR   (the table from two calls)
benchmarks/gpu_serving_vs_vllm.sh runs it on the H200 in two device calls.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections import deque
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(vocab_size=49152, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
             max_position_embeddings=8192)
SETTINGS = dict(kv_gib=60, max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192)
NUM_REQUESTS, INPUT_CLIP = 500, 4096
SCALES = (1, 4, 8)
B1_PROMPT, B1_TOKENS, B1_REPEATS = 256, 256, 3
BURSTS = {"burst_64x1000_128": (64, 1000, 128), "burst_8x512_256": (8, 512, 256)}
PROFILE_SCALE, PROFILE_FROM_S, PROFILE_STEPS = 4, 15.0, 24  # the profiled replay: 24 steps from 15 s in, at 4x
OUR_OPTS = ("paged_kv", "flash_attn", "dynamic_batching", "batched_decode", "cuda_graphs", "fused_kernels",
            "skinny_gemm", "chunked_prefill")
TINY = bool(os.environ.get("GPU_SERVING_TINY"))  # a 2-layer shape on the CPU: checks this script's logic only
if TINY:
    SHAPE.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32)
    SETTINGS.update(kv_gib=0.05, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=1024)
    NUM_REQUESTS, INPUT_CLIP, SCALES = 12, 200, (50,)
    PROFILE_SCALE, PROFILE_FROM_S, PROFILE_STEPS = 50, 0.05, 3
    B1_PROMPT, B1_TOKENS, B1_REPEATS = 16, 8, 1
    BURSTS = {"burst_64x1000_128": (4, 64, 8)}


# --- the workload: identical for both engines ---

def make_requests(csv_path: Path, out: Path) -> None:
    """The trace's first rows as (seconds since the first, input tokens clipped, output tokens)."""
    rows = []
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            t = datetime.strptime(row["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            rows.append((t, min(int(row["ContextTokens"]), INPUT_CLIP), int(row["GeneratedTokens"])))
            if len(rows) == 500:
                break
    t0 = rows[0][0]
    out.write_text(json.dumps([[round(t - t0, 6), i, o] for t, i, o in rows]))


def load_requests(path: Path) -> list[tuple[str, float, list[int], int]]:
    rows = json.loads(Path(path).read_text())[:NUM_REQUESTS]
    out = []
    for k, (t, n_in, n_out) in enumerate(rows):
        rng = random.Random(k)
        n_in = min(n_in, INPUT_CLIP)
        out.append((f"r{k}", t, [rng.randrange(10, SHAPE["vocab_size"]) for _ in range(max(1, n_in))], n_out))
    return out


def prompts(seed: int, n: int, length: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, SHAPE["vocab_size"]) for _ in range(length)] for _ in range(n)]


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(recs: list[dict], t0: float) -> dict:
    """recs: scheduled, first, finished (monotonic s), tokens. Times in ms."""
    done = [r for r in recs if r.get("finished") is not None]
    ttft = [(r["first"] - r["scheduled"]) * 1e3 for r in done]
    e2e = [(r["finished"] - r["scheduled"]) * 1e3 for r in done]
    tpot = [(r["finished"] - r["first"]) * 1e3 / (r["tokens"] - 1) for r in done if r["tokens"] > 1]
    makespan = max(r["finished"] for r in done) - t0 if done else float("nan")
    r2 = lambda x: None if x is None else round(x, 2)  # noqa: E731
    return {"completed": len(done), "of": len(recs), "makespan_s": round(makespan, 2),
            "out_tok_s": round(sum(r["tokens"] for r in done) / makespan, 1),
            "ttft_ms_p50": r2(pct(ttft, .5)), "ttft_ms_p99": r2(pct(ttft, .99)),
            "tpot_ms_p50": r2(pct(tpot, .5)), "tpot_ms_p99": r2(pct(tpot, .99)),
            "e2e_ms_p50": r2(pct(e2e, .5)), "e2e_ms_p99": r2(pct(e2e, .99))}


def b1_and_bursts(generate) -> dict:
    """generate(prompt_lists, max_tokens) -> output token counts, returning when all are done."""
    res: dict = {}
    generate(prompts(99, 4, 512), 16)
    t_full, t_one = [], []
    for r in range(B1_REPEATS):
        for n, acc in ((B1_TOKENS, t_full), (1, t_one)):
            t = time.perf_counter()
            got = generate(prompts(1000 * n + r, 1, B1_PROMPT), n)
            acc.append(time.perf_counter() - t)
            assert got == [n], f"asked for {n} tokens, got {got}"
    full, one = statistics.median(t_full), statistics.median(t_one)
    res["decode_b1"] = dict(ms_per_token=round((full - one) * 1e3 / (B1_TOKENS - 1), 3),
                            ttft_ms=round(one * 1e3, 2), runs_full_s=[round(x, 4) for x in t_full])
    for i, (name, (n, plen, out)) in enumerate(BURSTS.items()):
        t = time.perf_counter()
        got = generate(prompts(10 + i, n, plen), out)
        el = time.perf_counter() - t
        assert got == [out] * n, f"{name}: output lengths {sorted(set(got))}, asked for {out}"
        res[name] = dict(elapsed_s=round(el, 3), output_tok_s=round(n * out / el, 1))
    return res


# --- ours ---

def our_engine(chunked: bool, piecewise: bool = False):
    import torch

    sys.path.insert(0, str(ROOT))
    from optladder.engine.config import EngineConfig, ModelConfig
    from optladder.engine.llm_engine import LLMEngine

    mcfg = ModelConfig(name="llama3_8b_shape_v49k", source="random", package=None, gguf_file=None,
                       tokenizer="synthetic", tie_word_embeddings=False, **SHAPE)
    cuda_only = ("cuda_graphs", "fused_kernels", "skinny_gemm")
    opts = {o: o != "chunked_prefill" or chunked for o in OUR_OPTS if not (TINY and o in cuda_only)}
    if piecewise and not TINY:
        opts["piecewise_graphs"] = True
    ecfg = EngineConfig(dtype="float32" if TINY else "bfloat16", device="cpu" if TINY else "cuda",
                        max_model_len=SETTINGS["max_model_len"], kv_cache_gb=SETTINGS["kv_gib"],
                        max_num_seqs=SETTINGS["max_num_seqs"], batch_size=SETTINGS["max_num_seqs"],
                        max_num_batched_tokens=SETTINGS["max_num_batched_tokens"], **opts)
    t = time.perf_counter()
    engine = LLMEngine(mcfg, ecfg)
    if not TINY:
        torch.cuda.synchronize()
    return engine, time.perf_counter() - t


def replay_ours(engine, reqs, scale: float, profile_dir: Path | None = None, profile_from_step: int = 0,
                profile_steps: int = PROFILE_STEPS) -> dict:
    """The open-loop replay, stepping the engine on this thread; records every step's time and what it
    carried, and (profile_dir) a torch profiler table of `profile_steps` steps from step `profile_from_step`:
    the profiler's trace is prepared before the replay starts and records only those steps (not a measurement
    all the same: the seconds spent in the profiler's calls during the replay are in `profiler_stall_s`, the
    steps it recorded in `profiled_step_numbers`)."""
    from optladder.engine.sequence import SamplingParams

    from torch.profiler import record_function

    engine.reset_stats()
    prof, stall = None, 0.0
    if profile_dir is not None:
        t = time.perf_counter()
        prof = _start_profiler(profile_from_step, profile_steps)
        setup_s = time.perf_counter() - t
    t0 = time.monotonic() + 0.02
    pending = deque(sorted(reqs, key=lambda r: r[1]))
    recs = {rid: {"scheduled": t0 + t / scale, "first": None, "finished": None, "tokens": 0}
            for rid, t, _, _ in reqs}
    steps: list[tuple[float, int, int]] = []  # seconds, prompt tokens, decode tokens
    starts: list[float] = []  # each step's start, seconds after the replay's start (the gaps: host work outside step())
    st = engine.step_stats
    while pending or engine.has_unfinished():
        now = time.monotonic()
        while pending and recs[pending[0][0]]["scheduled"] <= now:
            rid, _, ids, n_out = pending.popleft()
            engine.add_request(rid, ids, SamplingParams(max_tokens=n_out, ignore_eos=True),
                               arrival_time=recs[rid]["scheduled"])
        if not engine.has_unfinished():
            time.sleep(max(0.0, recs[pending[0][0]]["scheduled"] - time.monotonic()))
            continue
        p0, d0, t = st.prefill_tokens, st.decode_tokens, time.perf_counter()
        starts.append(time.monotonic() - t0)
        # a profiled replay names each step in its trace: which ones it recorded is read back from it
        with record_function(f"{STEP_MARK}{len(steps)}") if prof is not None else nullcontext():
            events = engine.step()
        steps.append((time.perf_counter() - t, st.prefill_tokens - p0, st.decode_tokens - d0))
        if prof is not None:
            t = time.perf_counter()
            prof.step()
            stall += time.perf_counter() - t
        for ev in events:
            rec = recs[ev.request_id]
            rec["first"] = rec["first"] or ev.time
            rec["tokens"] = ev.num_output_tokens
            if ev.finished:
                rec["finished"] = ev.time
    out = summarize(list(recs.values()), t0)
    sm = engine.stage_metrics()
    out["engine"] = {k: round(v, 3) for k, v in sm.items() if k.startswith(("perf/", "stage/"))}
    out["chunked_prefill"] = engine.opts_effective()["chunked_prefill"]
    out["steps"] = step_summary(steps)
    # every step: start (ms after the replay's start), duration (ms), prompt tokens, decode tokens
    out["step_log"] = [[round(a * 1e3, 2), round(s * 1e3, 3), p, d] for a, (s, p, d) in zip(starts, steps)]
    if prof is not None:
        a, b = profile_from_step, profile_from_step + profile_steps
        out["profiled_step_numbers"] = _stop_profiler(prof, profile_dir / "profile_ours_replay.txt", steps[a:b],
                                                      starts[a] if a < len(starts) else None)
        out["profiled_steps"] = [a, b]
        out["profiler_stall_s"] = round(stall, 3)
        out["profiler_setup_s"] = round(setup_s, 3)
    return out


def step_summary(steps: list[tuple[float, int, int]]) -> dict:
    """Step times (ms) by kind, and the slowest steps with what they carried."""
    kinds = {"decode": [s for s in steps if not s[1]], "prompt_only": [s for s in steps if s[1] and not s[2]],
             "mixed": [s for s in steps if s[1] and s[2]]}
    out = {}
    for name, xs in kinds.items():
        ms = [x[0] * 1e3 for x in xs]
        out[name] = {"n": len(xs), "ms_p50": pct(ms, .5), "ms_p99": pct(ms, .99), "ms_max": max(ms, default=None),
                     "prompt_tokens_mean": statistics.fmean([x[1] for x in xs]) if xs else None,
                     "decode_tokens_mean": statistics.fmean([x[2] for x in xs]) if xs else None}
    # mixed steps by their prompt tokens: where the eager launch cost (small) or the GEMMs (large) dominate
    out["mixed_by_prompt_tokens"] = {}
    for lo, hi in MIXED_BUCKETS:
        xs = [x for x in kinds["mixed"] if lo <= x[1] <= hi]
        ms = [x[0] * 1e3 for x in xs]
        out["mixed_by_prompt_tokens"][f"{lo}-{hi if hi < 1 << 30 else ''}"] = {
            "n": len(xs), "ms_p50": pct(ms, .5), "total_s": round(sum(ms) / 1e3, 3),
            "decode_tokens_mean": statistics.fmean([x[2] for x in xs]) if xs else None}
    # decode-only steps by their rows: what a step of each size costs (the weights read once, the KV read per row)
    out["decode_by_rows"] = {}
    for lo, hi in DECODE_BUCKETS:
        ms = [x[0] * 1e3 for x in kinds["decode"] if lo <= x[2] <= hi]
        out["decode_by_rows"][f"{lo}-{hi}"] = {"n": len(ms), "ms_p50": pct(ms, .5), "total_s": round(sum(ms) / 1e3, 3)}
    out["slowest"] = [[round(s * 1e3, 1), p, d] for s, p, d in sorted(steps, reverse=True)[:15]]
    return out


MIXED_BUCKETS = ((1, 128), (129, 512), (513, 1024), (1025, 2048), (2049, 1 << 30))
DECODE_BUCKETS = ((1, 32), (33, 64), (65, 128), (129, 256))


def _start_profiler(from_step: int, steps: int):
    """A profiler that records steps [from_step, from_step + steps) of the prof.step() calls to come. It warms up
    from the first step, so its trace is prepared here, before the replay: prepared at a later step it stalled
    the H200 engine for seconds there."""
    import warnings

    from torch.profiler import ProfilerActivity, profile, schedule

    with warnings.catch_warnings():  # warmup=0 (a window from step 0) is warned about, and is what is meant
        warnings.simplefilter("ignore")
        prof = profile(activities=[ProfilerActivity.CPU] + ([] if TINY else [ProfilerActivity.CUDA]),
                       schedule=schedule(wait=0, warmup=from_step, active=steps, repeat=1))
        prof.__enter__()
    return prof


def _stop_profiler(prof, path: Path, steps, start_s: float | None) -> list[int]:
    """Write the table of the recorded steps; the numbers of the replay's steps (from 0) the trace holds."""
    prof.__exit__(None, None, None)
    if start_s is None:  # the replay ended before the window: nothing was recorded
        path.write_text("no step profiled: the replay ended before the profiled steps began\n")
        return []
    key = "cpu_time_total" if TINY else "device_time_total"
    head = f"steps profiled from {start_s:.1f} s into the replay (ms, prompt tokens, decode tokens): " + \
        ", ".join(f"({s * 1e3:.1f}, {p}, {d})" for s, p, d in steps)
    path.write_text(head + "\n" + prof.key_averages().table(sort_by=key, row_limit=30))
    return sorted({int(e.name[len(STEP_MARK):]) for e in prof.events() if e.name.startswith(STEP_MARK)})


STEP_MARK = "replay step "  # a profiled replay's steps, named in its trace


def worker_ours(args) -> dict:
    import torch

    reqs = load_requests(args.requests)
    res: dict = {"engine": "reference (optladder)", "torch": torch.__version__, "opts": list(OUR_OPTS)}
    engine, init_s = our_engine(chunked=True)
    res["init_s"] = round(init_s, 1)
    sync = (lambda: None) if TINY else torch.cuda.synchronize

    from optladder.engine.sequence import SamplingParams

    def generate(ps, n):
        seqs = engine.generate(ps, SamplingParams(max_tokens=n, ignore_eos=True))
        sync()
        return [s.num_output_tokens for s in seqs]

    if not args.skip_bursts:
        res.update(b1_and_bursts(generate))
    save = lambda: args.json.write_text(json.dumps(res, indent=1, default=str))  # noqa: E731  (a timeout keeps what ran)
    save()
    res["replay"] = {}
    for s in SCALES:
        res["replay"][str(s)] = [replay_ours(engine, reqs, s) for _ in range(args.repeats if s > 1 else 1)]
        save()
    if str(PROFILE_SCALE) in res["replay"]:  # the profiled steps: where the last measured repeat was PROFILE_FROM_S in
        log = res["replay"][str(PROFILE_SCALE)][-1]["step_log"]
        at = next((i for i, x in enumerate(log) if x[0] >= PROFILE_FROM_S * 1e3), None)
        run = replay_ours(engine, reqs, PROFILE_SCALE, profile_dir=args.out, profile_from_step=at or 0)
        run["profile_window"] = (f"from step {at}, where the last measured repeat was {PROFILE_FROM_S:g} s in"
                                 if at is not None else
                                 f"from step 0: the last measured repeat ended before {PROFILE_FROM_S:g} s")
        res["replay_profiled"] = {str(PROFILE_SCALE): run}
    save()
    res["graphs"] = engine.opts_effective()["cuda_graphs"]
    if not TINY:
        res.update(gpu=torch.cuda.get_device_name(0), peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))
    del engine
    import gc

    gc.collect()
    if not TINY:
        torch.cuda.empty_cache()
    save()
    if args.skip_ablation:
        return res
    engine, _ = our_engine(chunked=False)  # the ablation: the same engine, each prefill a step of its own
    res["replay_no_chunked"] = {str(s): [replay_ours(engine, reqs, s)] for s in SCALES if s == 4 or TINY}
    return res


# --- vLLM ---

class VllmSteps:
    """vLLM's iterations as a replay saw them, from the stats its AsyncLLM hands a stat logger after each engine
    step: with iteration details on, when the iteration's outputs were recorded, how long the engine core blocked
    waiting for the model's output, and its prompt and decode tokens; without them, the tokens of the outputs
    processed (prompt tokens unknown) and no time. vLLM 0.26 schedules asynchronously, so the core's wait is not a
    step's time (the next step is launched before it waits); the spacing of the records is the engine's period,
    which is the step's time while the GPU stays busy, and is what the step summary holds. Around an iteration
    with prompt work a spacing is not always its own step's: on the H200 (2026-12-02) the record before one often
    held a long spacing (medians over all records with prompt work: 21.4 ms before against 6.7 ms for it at 1x,
    about equal at 8x; why is not established), so benchmarks/serving_steps_compare.py compares such steps paired
    with the one before them and leaves the decode-only records next to them out. Plain Python:
    `logger_class` wraps it in vLLM's StatLoggerBase."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.rows: list[tuple[float, float | None, int | None, int]] = []  # (recorded, wait s, prompt, decode)

    def record(self, scheduler_stats=None, iteration_stats=None, *_, **__) -> None:
        now = self.clock()
        d = getattr(scheduler_stats, "iteration_details", None)
        if d is not None and not getattr(d, "is_dummy", False):
            self.rows.append((now, d.elapsed_ms / 1e3, int(d.num_ctx_tokens), int(d.num_generation_tokens)))
        elif d is None and iteration_stats is not None:
            self.rows.append((now, None, None, int(getattr(iteration_stats, "num_generation_tokens", 0))))

    def clear(self) -> None:
        self.rows.clear()

    def summary(self, t0: float) -> dict:
        """step_summary's figures over the iterations with details, each timed by the spacing of its record from
        the one before (the first has none), and every such iteration: [recorded ms after t0, the core's wait ms,
        prompt tokens, decode tokens]."""
        timed = [r for r in self.rows if r[1] is not None]
        out = {"iterations": len(self.rows), "with_details": len(timed)}
        if timed:
            out["steps"] = step_summary([(cur[0] - prev[0], cur[2], cur[3]) for prev, cur in zip(timed, timed[1:])])
            out["step_log"] = [[round((t - t0) * 1e3, 2), round(w * 1e3, 3), p, d] for t, w, p, d in timed]
        return out

    def logger_class(self):
        """A vLLM StatLoggerBase whose every instance records into this log."""
        try:
            from vllm.v1.metrics.loggers import StatLoggerBase
        except ImportError:  # where an older vLLM keeps it
            from vllm.v1.metrics.base import StatLoggerBase
        log = self

        class StepLogger(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0):
                pass

            def record(self, *a, **k):
                log.record(*a, **k)

            def log_engine_initialized(self):
                pass

        return StepLogger


def worker_vllm(args) -> dict:
    from gpubench.vllm_model import offline_env, random_llama_dir

    offline_env()
    import vllm
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    model_dir = random_llama_dir(Path("/tmp/gpu_serving_model"), SHAPE, args.tok_dir)
    reqs = load_requests(args.requests)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    t = time.perf_counter()
    steps = VllmSteps()
    # each iteration's tokens and model time (vLLM 0.26; an older one logs the outputs' tokens alone). Our stat
    # logger keeps the stats on; vLLM's default loggers stay off (with the details on, its logging logger would
    # write a line an iteration from the process that serves the requests)
    details = ({"enable_logging_iteration_details": True, "disable_log_stats": True}
               if "enable_logging_iteration_details" in {f.name for f in dataclasses.fields(AsyncEngineArgs)} else {})
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=str(model_dir), load_format="dummy", dtype="bfloat16", max_model_len=SETTINGS["max_model_len"],
        max_num_seqs=SETTINGS["max_num_seqs"], max_num_batched_tokens=SETTINGS["max_num_batched_tokens"],
        enable_prefix_caching=False, seed=0, kv_cache_memory_bytes=int(SETTINGS["kv_gib"] * 2**30),
        **details, **(dict(enforce_eager=True) if TINY else {})), stat_loggers=[steps.logger_class()])
    init_s = time.perf_counter() - t
    counter = iter(range(10**9))

    async def one(ids, n, scheduled=None):
        if scheduled is not None:
            await asyncio.sleep(max(0.0, scheduled - time.monotonic()))
        sp = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0, output_kind=RequestOutputKind.DELTA)
        rec = {"scheduled": scheduled, "first": None, "finished": None, "tokens": 0}
        async for out in engine.generate(request_id=f"q{next(counter)}", prompt=TokensPrompt(prompt_token_ids=ids),
                                         sampling_params=sp):
            now = time.monotonic()
            k = len(out.outputs[0].token_ids)
            if k and rec["first"] is None:
                rec["first"] = now
            rec["tokens"] += k
            if out.finished:
                rec["finished"] = now
        return rec

    async def many(ps, n):
        return [r["tokens"] for r in await asyncio.gather(*(one(p, n) for p in ps))]

    def generate(ps, n):
        return loop.run_until_complete(many(ps, n))

    async def replay(scale):
        t0 = time.monotonic() + 0.05
        steps.clear()
        recs = await asyncio.gather(*(one(ids, n, t0 + t / scale) for _, t, ids, n in reqs))
        return {**summarize(list(recs), t0), **steps.summary(t0)}

    try:
        res = {"engine": f"vLLM {vllm.__version__}", "init_s": round(init_s, 1),
               "settings": "AsyncLLM, its defaults (torch.compile + CUDA graphs, chunked prefill, FlashAttention 3 "
                           "on Hopper), prefix caching off, the same KV budget and limits as ours"}
        if not args.skip_bursts:
            res.update(b1_and_bursts(generate))
        res["replay"] = {}
        for s in SCALES:
            res["replay"][str(s)] = [loop.run_until_complete(replay(s)) for _ in range(args.repeats if s > 1 else 1)]
            args.json.write_text(json.dumps(res, indent=1, default=str))  # a timeout keeps what ran
    finally:
        engine.shutdown()
    return res


# --- running and reporting ---

def run_worker(which: str, args) -> dict:
    path = args.out / f"serving_{which}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--worker", which, "--json", str(path), "--requests", str(args.requests),
           "--tok-dir", args.tok_dir or "", "--out", str(args.out), "--repeats", str(args.repeats),
           "--scales", args.scales] + ["--skip-bursts"] * args.skip_bursts + ["--skip-ablation"] * args.skip_ablation
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, timeout=args.timeout, capture_output=True)
        out_b, err_b, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out_b, err_b, rc = e.stdout or b"", e.stderr or b"", "timeout"
    log = (out_b + err_b).decode(errors="replace")
    (args.out / f"serving_{which}.log").write_text(log[-200_000:])
    print(f"{which}: exit {rc} after {time.perf_counter() - t:.0f} s", flush=True)
    return json.loads(path.read_text()) if path.exists() else {"error": f"exit {rc}", "log_tail": log[-3000:]}


def median_run(runs: list[dict]) -> dict:
    """Per metric, the median over repeats (tails of a saturated engine are noisy)."""
    if not runs or "error" in runs[0]:
        return {}
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(r[k] for r in runs if r.get(k) is not None) for k in keys}


def report(ours: dict, theirs: dict) -> str:
    lines = ["| time scale | engine | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | E2E p99 s | done |",
             "|---|---|---|---|---|---|---|"]
    ratios = ["| time scale | out tok/s | TTFT p99 | TPOT p99 | E2E p99 |", "|---|---|---|---|---|"]

    def row(scale, name, m):
        f = lambda k, d=0: "-" if m.get(k) is None else f"{m[k]:,.{d}f}"  # noqa: E731
        e2e = "-" if m.get("e2e_ms_p99") is None else f"{m['e2e_ms_p99'] / 1e3:.1f}"
        return (f"| {scale}× | {name} | {f('out_tok_s')} | {f('ttft_ms_p50')} / {f('ttft_ms_p99')} | "
                f"{f('tpot_ms_p50', 1)} / {f('tpot_ms_p99', 1)} | {e2e} | {f('completed')} |")

    for s in SCALES:
        o = median_run(ours.get("replay", {}).get(str(s), []))
        v = median_run(theirs.get("replay", {}).get(str(s), []))
        for name, d in ((theirs.get("engine", "vLLM"), theirs), ("optladder, chunked_prefill", ours)):
            runs = d.get("replay", {}).get(str(s), [])
            for i, run in enumerate(runs):  # every repeat: a tail is noisy, and a median of two hides one
                lines.append(row(s, name + (f" (repeat {i + 1})" if len(runs) > 1 else ""), run))
            if not runs:
                lines.append(row(s, name, {}))
        nc = median_run(ours.get("replay_no_chunked", {}).get(str(s), []))
        if nc:
            lines.append(row(s, "optladder, without chunked_prefill", nc))
        if o and v:
            r = lambda k: f"{o[k] / v[k]:.2f}×" if o.get(k) and v.get(k) else "-"  # noqa: E731
            ratios.append(f"| {s}× | {r('out_tok_s')} | {r('ttft_ms_p99')} | {r('tpot_ms_p99')} | {r('e2e_ms_p99')} |")
    g = lambda d, *ks: (d.get(ks[0], {}) or {}).get(ks[1])  # noqa: E731
    other = ["| measure | optladder | vLLM | optladder / vLLM |", "|---|---|---|---|"]
    for label, keys in [("batch-1 decode, ms per output token", ("decode_b1", "ms_per_token"))] + \
            [(f"{n} × {p} → {o}, output tok/s", (k, "output_tok_s")) for k, (n, p, o) in BURSTS.items()]:
        a, b = g(ours, *keys), g(theirs, *keys)
        other.append(f"| {label} | {a} | {b} | {f'{a / b:.2f}×' if a and b else '-'} |")
    other.append(f"| engine start, s | {ours.get('init_s')} | {theirs.get('init_s')} | - |")
    return "\n".join(["## Azure conversation trace, first 500 requests (each repeat; ratios from medians)", "",
                      *lines, "", "optladder (chunked) / vLLM (≤ 1.00× is level or better for latency, ≥ 0.95× "
                      "for throughput):", "", *ratios, "", "## Batch-1 decode and bursts", "", *other])


def steps_table(ours: dict, theirs: dict) -> list[str]:
    """Each engine's steps in its first replay at each scale: how many of each kind and their median time (ours:
    the whole step; vLLM's: the spacing of its records, see VllmSteps), then its decode-only steps by rows."""
    firsts = []  # (scale, engine, the first replay's step summary)
    for sc in SCALES:
        for name, d in (("optladder", ours), (theirs.get("engine", "vLLM"), theirs)):
            runs = d.get("replay", {}).get(str(sc), [])
            st = (runs[0] if runs else {}).get("steps")
            if st:
                firsts.append((sc, name, st))
    if not firsts:
        return []
    f = lambda v, d=1: "-" if v is None else f"{v:,.{d}f}"  # noqa: E731
    lines = ["| time scale | engine | decode-only steps: n, ms p50, rows | mixed: n, ms p50, prompt tokens, rows | "
             "prompt-only: n, ms p50 |", "|---|---|---|---|---|"]
    for sc, name, st in firsts:
        dec, mix, pro = st["decode"], st["mixed"], st["prompt_only"]
        lines.append(f"| {sc}× | {name} | {dec['n']:,}, {f(dec['ms_p50'], 2)}, {f(dec['decode_tokens_mean'])} | "
                     f"{mix['n']:,}, {f(mix['ms_p50'], 2)}, {f(mix['prompt_tokens_mean'], 0)}, "
                     f"{f(mix['decode_tokens_mean'])} | {pro['n']:,}, {f(pro['ms_p50'], 2)} |")
    lines += ["", "vLLM's times are the spacing of each iteration's record from the one before; around an iteration "
              "with prompt work that is not always its own step's time (the record before often holds a long "
              "spacing), so its mixed and prompt-only medians, and the decode-only ones next to them, are not "
              "exact: `benchmarks/serving_steps_compare.py` leaves those decode-only records out and pairs each "
              "step with prompt work with the step before it, in both engines.",
              "", "Decode-only steps by their decode rows: n, ms p50", "",
              "| time scale | engine | " + " | ".join(f"{lo}-{hi} rows" for lo, hi in DECODE_BUCKETS) + " |",
              "|---|---|" + "---|" * len(DECODE_BUCKETS)]
    for sc, name, st in firsts:
        by = st.get("decode_by_rows")
        if by:
            lines.append(f"| {sc}× | {name} | " + " | ".join(
                f"{by[f'{lo}-{hi}']['n']:,}, {f(by[f'{lo}-{hi}']['ms_p50'], 2)}" for lo, hi in DECODE_BUCKETS)
                + " |")
    return lines


def write_report(out: Path, ours: dict, theirs: dict) -> str:
    md = ["# optladder (every GPU switch, chunked prefill) vs vLLM under the Azure trace, one GPU", "",
          f"- command: `bash benchmarks/gpu_serving_vs_vllm.sh` (report written "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
          f"- GPU: {ours.get('gpu', '?')}; torch {ours.get('torch', '?')}; {theirs.get('engine', 'vLLM: ' + str(theirs.get('error')))}",
          "- model: Llama-3-8B's shape with a 49,152-token vocabulary, random bf16 weights; identical token ids; "
          "EOS ignored; greedy",
          f"- settings, both: KV {SETTINGS['kv_gib']} GiB, max_num_seqs {SETTINGS['max_num_seqs']}, "
          f"max_num_batched_tokens {SETTINGS['max_num_batched_tokens']}, max_model_len {SETTINGS['max_model_len']}, "
          "no prefix caching",
          f"- optladder: {', '.join(ours.get('opts', []))}; vLLM: {theirs.get('settings', '-')}", "",
          report(ours, theirs), ""]
    steps = steps_table(ours, theirs)
    if steps:
        md += ["## Steps (the first replay at each scale)", "", *steps, ""]
    for scale, run in (ours.get("replay_profiled") or {}).items():
        md += [f"A further {scale}× replay of ours ran with the torch profiler on (steps {run.get('profiled_steps')}, "
               f"{run.get('profile_window')}; "
               f"its calls during the replay took {run.get('profiler_stall_s')} s; set up before it in "
               f"{run.get('profiler_setup_s')} s): not counted above; "
               "its table is profile_ours_replay.txt.", ""]
    for name, d in (("ours", ours), ("vllm", theirs)):
        if "error" in d:
            md += [f"{name} failed: {d['error']}", "", "```", d.get("log_tail", ""), "```", ""]
    text = "\n".join(md)
    (out / "gpu_serving_vs_vllm.md").write_text(text)
    (out / "gpu_serving_vs_vllm.json").write_text(json.dumps({"optladder": ours, "vllm": theirs}, indent=1))
    return text


def main() -> int:
    global SCALES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_out"))
    ap.add_argument("--requests", type=Path, default=None)
    ap.add_argument("--make-requests", type=Path, default=None, help="the trace CSV to take the rows from")
    ap.add_argument("--combine", nargs=2, type=Path, default=None, help="ours.json vllm.json")
    ap.add_argument("--tok-dir", default=None)
    ap.add_argument("--timeout", type=float, default=530)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--scales", default=",".join(map(str, SCALES)), help="time scales to replay, e.g. 4 or 1,4,8")
    ap.add_argument("--skip-bursts", action="store_true", help="no batch-1 decode and burst measures")
    ap.add_argument("--skip-ablation", action="store_true", help="no 4x replay without chunked_prefill")
    ap.add_argument("--only", choices=["ours", "vllm"], default=None)
    ap.add_argument("--worker", choices=["ours", "vllm"], default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    try:
        SCALES = tuple(int(v) if v.is_integer() else v for v in (float(x) for x in args.scales.split(",")))
        if not all(v > 0 and math.isfinite(v) for v in SCALES):
            raise ValueError
    except ValueError:
        ap.error(f"--scales {args.scales!r}: positive time scales separated by commas, e.g. 4 or 1,4,8")
    if args.make_requests:
        make_requests(args.make_requests, args.requests)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.combine:
        print(write_report(args.out, *(json.loads(p.read_text()) for p in args.combine)))
        return 0
    if args.worker:
        res = worker_ours(args) if args.worker == "ours" else worker_vllm(args)
        args.json.write_text(json.dumps(res, indent=1, default=str))
        sys.stdout.flush()
        os._exit(0)  # vLLM's engine process and its teardown: the results are written, leave now
    ours = run_worker("ours", args) if args.only in (None, "ours") else {}
    theirs = run_worker("vllm", args) if args.only in (None, "vllm") else {}
    print(write_report(args.out, ours, theirs))
    return 0 if "error" not in ours and "error" not in theirs else 1


if __name__ == "__main__":
    sys.exit(main())
