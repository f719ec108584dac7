"""vLLM's Prometheus /metrics as our metrics: scrape before and after a replay and report the deltas,
sample the KV usage gauge during it. The text format is parsed here (a few lines; no client library in
the project's environment), summing each series over its label sets (engines, finish reasons).

Names move between vLLM versions: each quantity lists the names it has had, first match wins
(`gpu_cache_usage_perc` before vLLM 0.10, `kv_cache_usage_perc` after; counters gained `_total`).
"""
from __future__ import annotations

import logging
import re
import threading
import urllib.request
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
                  "vllm:gpu_prefix_cache_queries_total")
HISTOGRAMS = {  # our name: vLLM's histogram, seconds
    "perf/server_ttft_ms_mean": "vllm:time_to_first_token_seconds",
    "perf/server_itl_ms_mean": "vllm:inter_token_latency_seconds",
    "perf/server_e2e_ms_mean": "vllm:e2e_request_latency_seconds",
    "perf/server_queue_ms_mean": "vllm:request_queue_time_seconds",
}


@dataclass
class Scrape:
    values: dict[str, float] = field(default_factory=dict)  # series name -> sum over label sets
    labels: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def first(self, names: tuple[str, ...]) -> float | None:
        for n in names:
            if n in self.values:
                return self.values[n]
        return None


def parse(text: str) -> Scrape:
    s = Scrape()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(3) or "", m.group(4)
        try:
            v = float(value)
        except ValueError:
            continue
        s.values[name] = s.values.get(name, 0.0) + v
        s.labels.setdefault(name, []).append(dict(_LABEL.findall(labels)))
    return s


def scrape(url: str, timeout_s: float = 10.0) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return parse(r.read().decode("utf-8", errors="replace"))


def deltas(before: Scrape, after: Scrape, kv_samples: list[float]) -> dict[str, float]:
    """The replay's own share of each counter, and the KV gauge as sampled while it ran."""
    out: dict[str, float] = {}

    def diff(names: tuple[str, ...]) -> float | None:
        a, b = after.first(names), before.first(names)
        return None if a is None else a - (b or 0.0)

    pre = diff(PREEMPTIONS)
    if pre is not None:
        out["perf/preemptions"] = pre
    hits, queries = diff(PREFIX_HITS), diff(PREFIX_QUERIES)
    if queries:
        out["perf/prefix_hit_rate"] = (hits or 0.0) / queries
    for ours, hist in HISTOGRAMS.items():
        total, count = diff((hist + "_sum",)), diff((hist + "_count",))
        if count:
            out[ours] = 1000.0 * total / count
    busy = [u for u in kv_samples if u > 0]
    if busy:  # like the reference engine: averaged over the moments that held any KV
        out["perf/kv_util"] = sum(busy) / len(busy)
        out["perf/kv_util_max"] = max(busy)
    return out


def kv_blocks(s: Scrape) -> tuple[int, int] | None:
    """(number of KV blocks, block size) from vllm:cache_config_info's labels, where vLLM reports them."""
    for labels in s.labels.get("vllm:cache_config_info", []):
        blocks, size = labels.get("num_gpu_blocks"), labels.get("block_size")
        if blocks and blocks != "None" and size and size != "None":
            return int(blocks), int(size)
    return None


class PeriodicSampler:
    """Calls `sample()` every `interval_s` on a daemon thread between `__enter__` and `__exit__`."""

    def __init__(self, interval_s: float, name: str):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class GaugeSampler(PeriodicSampler):
    """Reads one gauge every `interval_s` on a thread while a replay runs; a failed read is skipped."""

    def __init__(self, url: str, names: tuple[str, ...] = KV_USAGE, interval_s: float = 0.5):
        super().__init__(interval_s, "metrics-sampler")
        self.url, self.names = url, names
        self.samples: list[float] = []

    def sample(self) -> None:
        try:
            v = scrape(self.url, timeout_s=5.0).first(self.names)
            if v is not None:
                self.samples.append(v)
        except OSError as e:
            log.debug("metrics sample failed: %s", e)
