"""A workload: the exact requests a replay sends, built from a config, a tokenizer and a data root.

Sources (`name`): `builtin` (written for the project, needs no data folder: log-normal lengths within
`input_len_range` / `output_len_range`, prompts from builtin_text.txt), `azure_conv` (the Azure
conversation trace, `traces/azure_conv_2023.csv` under the data root unless `path` says otherwise),
`mooncake` and `jsonl` (`path` required), `sharegpt` (its prompts at their natural token length, output
lengths drawn as for builtin).

Steps: load -> sample `num_requests` rows (stratified on both lengths, a contiguous window, or the head)
-> KS distance of each length to the full trace -> fit lengths to max_model_len (and the KS distance
again, of what is sent) -> arrival times ->
prompts of exactly the sampled input lengths (traffic.materialize) -> `Request`s asking for exactly the
recorded output length, ignoring EOS.

Arrivals: poisson / gamma at `rate` (gamma with `cv`), `closed` (no schedule: a driver keeps
`concurrency` requests in flight), or `trace`: the trace's own timing scaled by `time_scale`. The rows
of a stratified sample are scattered over the whole trace, so their own timestamps would replay a rate
n/N of the real one; the schedule then takes the inter-arrival gaps of a contiguous window of n rows of
the same trace instead (seeded), which keeps the trace's rate and burstiness. Window and head samples
use their own timestamps.

Mooncake traces count prompts in 512-token hash blocks; with `block_tokens` B < 512 each block becomes B
tokens and input lengths scale by B/512, so the shared-prefix structure survives on small models.

Stats: `traffic/ks_{input,output}_len`: the KS distance of the lengths as sent (after the length policy)
to the full trace's (both in the replay's units: hash-block rows re-expressed in block_tokens);
`traffic/ks_{input,output}_len_trace`: the same of the sample before fitting, how well the sample represents
the trace (neither for builtin); `traffic/changed_lengths` (requests fitted to max_model_len),
`traffic/changed_{input,output}_share` (share of requests whose input, or output, length the policy
changed: above sampling.LENGTHS_CHANGED_WARN a warning and the run tag `optladder.lengths_changed=true`,
see `departures`); for hash-block traces `traffic/prefix_hit_rate_trace` and `traffic/prefix_hit_rate_replayed`
(materialize.prefix_hit_rate of the sample's 512-token blocks, and of the blocks as replayed after fitting:
above materialize.PREFIX_HIT_CHANGE_WARN apart, a warning and `optladder.prefix_reuse_changed=true`),
`traffic/{skipped,reordered}_rows`,
`traffic/num_requests`, `traffic/duration_s` and `traffic/mean_rate_req_s` ((n - 1) / duration; both 0
in closed mode). `Request.prompt` is the decoded text, for display and text-only endpoints: decoded
text does not re-tokenize to the same length (on the Azure sample with SmolLM2's tokenizer, most do
not), so drivers that can should send `prompt_token_ids`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from optladder.traffic.arrivals import gamma_arrivals, mean_rate, poisson_arrivals, trace_arrivals
from optladder.traffic.materialize import (PREFIX_HIT_CHANGE_WARN, PROMPT_SOURCES, build_pool, materialize_with_sources,
                                          prefix_groups, prefix_hit_rate, prompt_texts, sources_label)
from optladder.traffic.request import Request
from optladder.traffic.sampling import (LENGTH_POLICIES, LENGTHS_CHANGED_WARN, changed_shares, fit_lengths, ks_distance,
                                       stratified_sample, window_sample)
from optladder.traffic.traces import ON_BAD_ROW, TraceRow, load_trace

WORKLOADS = ("builtin", "azure_conv", "mooncake", "jsonl", "sharegpt")
TIMED_WORKLOADS = ("azure_conv", "mooncake", "jsonl")  # the only ones `arrival=trace` can replay
SAMPLINGS = ("stratified", "window", "head")
ARRIVALS = ("poisson", "gamma", "trace", "closed")
TRACE_KIND = {"azure_conv": "azure", "mooncake": "mooncake", "jsonl": "jsonl", "sharegpt": "sharegpt"}
DEFAULT_PATH = {"azure_conv": "traces/azure_conv_2023.csv", "sharegpt": "prompts/sharegpt_500.json"}
MOONCAKE_BLOCK = 512


@dataclass
class WorkloadConfig:
    name: str = "builtin"
    path: Optional[str] = None
    num_requests: int = 32
    sampling: str = "stratified"
    arrival: str = "poisson"
    rate: float = 2.0
    cv: float = 1.0
    concurrency: int = 4
    time_scale: float = 1.0
    seed: int = 0
    on_bad_row: str = "error"
    prompt_source: str = "auto"
    length_policy: str = "clip"
    block_tokens: int = 512
    input_len_range: list[int] = field(default_factory=lambda: [32, 384])
    output_len_range: list[int] = field(default_factory=lambda: [8, 96])

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class Workload:
    requests: list[Request]
    mode: str  # open: send each request at its scheduled_at; closed: keep `concurrency` in flight
    concurrency: int
    stats: dict[str, float]
    warnings: list[str]
    source: str


def validate(cfg: WorkloadConfig) -> None:
    """Every field checked, each failure naming the field, the bad value and what is valid."""
    for name, valid in (("name", WORKLOADS), ("sampling", SAMPLINGS), ("arrival", ARRIVALS),
                        ("on_bad_row", ON_BAD_ROW), ("prompt_source", PROMPT_SOURCES),
                        ("length_policy", LENGTH_POLICIES)):
        if getattr(cfg, name) not in valid:
            raise ValueError(f"workload.{name}={getattr(cfg, name)!r} is not valid; "
                             f"valid values: {', '.join(valid)}")
    for name, low in (("num_requests", 1), ("concurrency", 1), ("block_tokens", 1)):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"workload.{name} must be an integer >= {low}, got {value!r}")
    for name in ("rate", "cv", "time_scale"):
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"workload.{name} must be a number > 0, got {value!r}")
    for name in ("input_len_range", "output_len_range"):
        value = list(getattr(cfg, name))
        if len(value) != 2 or not all(isinstance(v, int) for v in value) or not 1 <= value[0] <= value[1]:
            raise ValueError(f"workload.{name} must be [low, high] integers with 1 <= low <= high, "
                             f"got {value}")
    if cfg.arrival == "trace" and cfg.name not in TIMED_WORKLOADS:
        raise ValueError(f"workload.arrival=trace needs a timed trace, and workload.name={cfg.name!r} has "
                         f"none; use it with {', '.join(TIMED_WORKLOADS)}, or set arrival to poisson, "
                         f"gamma or closed")
    if cfg.path is None and cfg.name in ("mooncake", "jsonl"):
        raise ValueError(f"workload.name={cfg.name} needs workload.path=<file> (absolute, or under the "
                         f"data root)")


def build_workload(cfg: WorkloadConfig, tokenizer: Any, max_model_len: int,
                   data_root: str | None = None) -> Workload:
    """The requests of `cfg`, every prompt + output within max_model_len. Deterministic for cfg.seed."""
    validate(cfg)
    warnings: list[str] = []
    stats = {"traffic/skipped_rows": 0.0, "traffic/reordered_rows": 0.0}
    full, source, timed = _load(cfg, tokenizer, data_root, stats, warnings)
    n = min(cfg.num_requests, len(full))
    if n < cfg.num_requests:
        warnings.append(f"asked for {cfg.num_requests} requests, the trace has {len(full)}: using all")
    idx = _sample(cfg.sampling, full, n, cfg.seed)
    rows = sample = [full[i] for i in idx]
    traced = cfg.name != "builtin"
    if traced:  # before fitting: how well the sample represents the trace
        for key in ("input_len", "output_len"):
            stats[f"traffic/ks_{key}_trace"] = ks_distance([getattr(r, key) for r in rows],
                                                           [getattr(r, key) for r in full])
    rows = _scale_blocks(rows, cfg.block_tokens, warnings)
    fitted, changed = fit_lengths(rows, max_model_len, cfg.length_policy)
    if changed:
        warnings.append(_fit_warning(rows, changed, max_model_len, cfg))
    stats["traffic/changed_input_share"], stats["traffic/changed_output_share"] = changed_shares(rows, fitted)
    if traced:  # what is sent, against the whole trace in the same units (hash blocks of block_tokens)
        reference = _scale_blocks(full, cfg.block_tokens, [])
        for key in ("input_len", "output_len"):
            stats[f"traffic/ks_{key}"] = ks_distance([getattr(r, key) for r in fitted],
                                                     [getattr(r, key) for r in reference])
    reuse = (prefix_hit_rate(sample, MOONCAKE_BLOCK), prefix_hit_rate(fitted, cfg.block_tokens))
    if None not in reuse:  # hash-block rows: the reuse the trace has over this window, and as replayed
        stats["traffic/prefix_hit_rate_trace"], stats["traffic/prefix_hit_rate_replayed"] = reuse
    warnings.extend(departures(stats).values())
    rows = fitted
    schedule = _schedule(cfg, full, idx, timed, source)
    requests, text_source = _requests(cfg, rows, schedule, tokenizer, data_root)
    closed = cfg.arrival == "closed"
    stats.update({"traffic/num_requests": float(n), "traffic/changed_lengths": float(changed),
                  "traffic/duration_s": 0.0 if closed else schedule[-1] - schedule[0],
                  "traffic/mean_rate_req_s": 0.0 if closed else mean_rate(schedule)})
    return Workload(requests, "closed" if closed else "open", cfg.concurrency, stats, warnings,
                    f"{source}; prompts: {text_source}")


def _load(cfg: WorkloadConfig, tokenizer: Any, data_root: str | None, stats: dict[str, float],
          warnings: list[str]) -> tuple[list[TraceRow], str, bool]:
    """(all rows, where they came from, whether they carry timing)."""
    if cfg.name == "builtin":
        ins = _log_normal(cfg.input_len_range, cfg.num_requests, cfg.seed)
        outs = _log_normal(cfg.output_len_range, cfg.num_requests, cfg.seed + 1)
        return [TraceRow(0.0, i, o) for i, o in zip(ins, outs)], "builtin", False
    trace = load_trace(TRACE_KIND[cfg.name], cfg.path or DEFAULT_PATH[cfg.name], cfg.on_bad_row,
                       data_root=data_root, tokenizer=tokenizer)
    rows = trace.rows
    if cfg.name == "sharegpt":  # prompts only: output lengths as for the builtin workload
        outs = _log_normal(cfg.output_len_range, len(rows), cfg.seed + 3)
        rows = [TraceRow(0.0, r.input_len, o, prompt_text=r.prompt_text) for r, o in zip(rows, outs)]
    warnings.extend(trace.warnings)
    stats["traffic/skipped_rows"] = float(trace.skipped)
    stats["traffic/reordered_rows"] = float(trace.reordered)
    if trace.skipped:
        warnings.append(f"{trace.path}: skipped {trace.skipped} bad rows (on_bad_row=skip)")
    if trace.reordered:
        warnings.append(f"{trace.path}: {trace.reordered} rows were out of time order; replaying sorted")
    return rows, f"{cfg.name}:{trace.path}", trace.has_timing


def _requests(cfg: WorkloadConfig, rows: list[TraceRow], schedule: list[float], tokenizer: Any,
              data_root: str | None) -> tuple[list[Request], str]:
    # builtin stays self-contained: the same requests with or without a data folder
    source = "builtin" if cfg.name == "builtin" and cfg.prompt_source == "auto" else cfg.prompt_source
    texts, text_source = prompt_texts(source, data_root, tokenizer)
    prompts, sources = materialize_with_sources(rows, build_pool(texts, tokenizer, text_source), tokenizer,
                                                cfg.seed + 2, cfg.block_tokens)
    requests = [Request(id=f"req-{i:05d}", prompt_token_ids=ids, output_len=r.output_len, scheduled_at=t,
                        prompt=tokenizer.decode(ids), ignore_eos=True, prefix_group=g)
                for i, (r, ids, t, g) in enumerate(zip(rows, prompts, schedule, prefix_groups(rows)))]
    return requests, sources_label(sources, text_source)


def departures(stats: dict[str, float]) -> dict[str, str]:
    """Where the replay departs from its trace, from a workload's stats (or a run's metrics, which hold them):
    {run tag: the sentence that says so, with the numbers}. A run sets each tag to "true"; its warnings,
    results.md and printed table carry the sentences. Empty when the replay is the trace's.

    `optladder.lengths_changed`: the length policy changed more than LENGTHS_CHANGED_WARN of the input or of
    the output lengths. `optladder.prefix_reuse_changed`: the hit rate of the blocks as replayed is more than
    materialize.PREFIX_HIT_CHANGE_WARN away from the trace's own (clipped prompts lose their last blocks)."""
    out: dict[str, str] = {}
    share_in, share_out = stats.get("traffic/changed_input_share"), stats.get("traffic/changed_output_share")
    if share_in is not None and share_out is not None and max(share_in, share_out) > LENGTHS_CHANGED_WARN:
        msg = (f"the length policy changed {share_in:.0%} of the input lengths and {share_out:.0%} of the output "
               f"lengths (more than {LENGTHS_CHANGED_WARN:.0%}): the replay does not have the trace's lengths")
        ks = [stats.get(f"traffic/ks_{k}_len{t}") for t in ("", "_trace") for k in ("input", "output")]
        if None not in ks:
            msg += (f"; KS distance to the trace of the lengths as replayed {ks[0]:.3f} (input) / {ks[1]:.3f} "
                    f"(output), of the sample before fitting {ks[2]:.3f} / {ks[3]:.3f}")
        out["optladder.lengths_changed"] = msg
    trace, replayed = stats.get("traffic/prefix_hit_rate_trace"), stats.get("traffic/prefix_hit_rate_replayed")
    if trace is not None and replayed is not None and abs(replayed - trace) > PREFIX_HIT_CHANGE_WARN:
        out["optladder.prefix_reuse_changed"] = (
            f"fitting the lengths moved the prefix-cache hit rate the trace's hash ids promise from {trace:.1%} "
            f"to {replayed:.1%} (by more than {PREFIX_HIT_CHANGE_WARN:.0%}): the replay does not have the trace's "
            f"prefix reuse")
    return out


def _fit_warning(rows: list[TraceRow], changed: int, max_model_len: int, cfg: WorkloadConfig) -> str:
    """How many requests did not fit, and the settings under which they would."""
    n = len(rows)
    verb = "clipped" if cfg.length_policy == "clip" else "scaled down"
    msg = (f"{changed} of {n} requests ({changed / n:.0%}) exceed engine.max_model_len={max_model_len} and were "
           f"{verb} (workload.length_policy={cfg.length_policy}); engine.max_model_len="
           f"{max(r.input_len + r.output_len for r in rows)} fits them all")
    hashed = [r for r in rows if r.hash_ids]
    # hash-block rows shrink with block_tokens: each fits up to its own largest value (below 1: at none, as a
    # row whose output alone fills the context); the largest value that fits every row that can fit
    limits = [cfg.block_tokens * (max_model_len - r.output_len) / max(1, r.input_len) for r in hashed]
    can = [b for b in limits if b >= 1]
    if can and min(can) < cfg.block_tokens:
        fit = int(min(can))
        msg += f", or workload.block_tokens={fit} (prompt blocks of {fit} tokens instead of 512)"
        if len(can) < len(hashed):
            msg += (f", which fits {len(can)} of the {len(hashed)} hash-block requests ({len(hashed) - len(can)} "
                    f"fit at no block_tokens)")
    if changed > n / 2:
        msg += ". Most requests changed: this replay does not have the trace's lengths"
    return msg


def _log_normal(bounds: list[int], n: int, seed: int) -> list[int]:
    """Right-skewed lengths like real traffic: median at the geometric middle, bounds at about 2 sigma."""
    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    draws = np.random.default_rng(seed).normal((lo + hi) / 2, (hi - lo) / 4, size=n)
    return np.clip(np.rint(np.exp(draws)), bounds[0], bounds[1]).astype(int).tolist()


def _sample(how: str, rows: list[TraceRow], n: int, seed: int) -> list[int]:
    if how == "stratified":
        return stratified_sample(rows, n, seed)
    if how == "window":
        return window_sample(rows, n, seed)
    return list(range(n))


def _scale_blocks(rows: list[TraceRow], block_tokens: int, warnings: list[str]) -> list[TraceRow]:
    """Mooncake input lengths re-expressed in blocks of block_tokens instead of 512."""
    if block_tokens == MOONCAKE_BLOCK or not any(r.hash_ids for r in rows):
        return rows
    warnings.append(f"hash-block rows: input lengths scaled by block_tokens/{MOONCAKE_BLOCK} = "
                    f"{block_tokens}/{MOONCAKE_BLOCK}")
    f = block_tokens / MOONCAKE_BLOCK
    return [TraceRow(r.timestamp_s, max(1, round(r.input_len * f)) if r.hash_ids else r.input_len,
                     r.output_len, r.hash_ids, r.prompt_text, r.output_text) for r in rows]


def _schedule(cfg: WorkloadConfig, full: list[TraceRow], idx: list[int], timed: bool,
              source: str) -> list[float]:
    n = len(idx)
    if cfg.arrival == "closed":
        return [0.0] * n
    if cfg.arrival == "poisson":
        return poisson_arrivals(n, cfg.rate, cfg.seed + 4)
    if cfg.arrival == "gamma":
        return gamma_arrivals(n, cfg.rate, cfg.cv, cfg.seed + 4)
    if not timed:
        raise ValueError(f"workload.arrival=trace: {source} has no timestamps; set workload.arrival to "
                         f"poisson, gamma or closed")
    if cfg.sampling == "stratified" and n < len(full):
        idx = window_sample(full, n, cfg.seed)  # see the module docstring: the trace's rate and bursts
    return trace_arrivals([full[i].timestamp_s for i in idx], cfg.time_scale)
