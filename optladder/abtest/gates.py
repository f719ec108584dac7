"""Gate definitions: what a candidate must show before it may roll out.

A `GateConfig` is loaded from a plain dict (the Hydra layer passes `OmegaConf.to_container(cfg.gate)`),
and every metric it names is checked against the metric contract of docs/design.md, so a typo in a gate
fails when the config is loaded rather than as a gate that silently never measures anything.
No torch, no I/O.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from optladder.abtest.environment import check_mode


def _metric_names() -> frozenset[str]:
    names = {f"perf/{m}_ms_{s}" for m in ("ttft", "tpot", "itl", "e2e")
             for s in ("mean", "p50", "p90", "p99", "p999")}
    names |= {f"perf/{m}" for m in ("throughput_req_s", "throughput_out_tok_s", "goodput_req_s",
                                     "peak_mem_gb", "kv_reserved_gb", "kv_used_gb", "kv_util",
                                     "lateness_ms_p50", "lateness_ms_p99", "requests_ok",
                                     "requests_failed", "makespan_s")}
    names |= {"traffic/ks_input_len", "traffic/ks_output_len"}
    names |= {f"quality/{m}_vs_ref" for m in ("bleu", "rouge1", "rouge2", "rougeL")}
    names |= {f"quality/{m}_vs_control" for m in ("bleu", "rougeL", "exact_match")}
    names |= {f"quality/near_tie_{m}" for m in ("equal", "diverged", "not_near", "worst_margin", "max_drift")}
    names |= {"quality/kl_vs_control_mean", "quality/kl_vs_control_p99", "quality/top1_agree_vs_control",
              "quality/ppl_ref_rel_change"}  # teacher-forced, lossy candidates (optladder/abtest/teacher_forced.py)
    return frozenset(names)


METRICS = _metric_names()
# latency metrics with per-request values, which a gate can put an interval on (optladder/abtest/run_pairs.py)
PAIRED_LATENCY = re.compile(r"perf/(ttft|tpot|e2e)_ms_(mean|p50|p90|p99)$")
# Families whose members are named per run (capacity/<slo>, stage/<stage>_ms_mean): any suffix is valid.
METRIC_PREFIXES = ("capacity/", "stage/")
# Higher is better for these; every other metric (latency, memory, lateness, failures, KS distance,
# stage times) is better lower.
_HIGHER_IS_BETTER = ("perf/throughput_", "perf/goodput_", "perf/kv_util", "perf/requests_ok",
                     "quality/", "capacity/")


def validate_metric(name: str) -> str:
    """The name itself when it is a metric of the docs/design.md contract; a ValueError listing them if not."""
    if name in METRICS or (name.startswith(METRIC_PREFIXES) and len(name) > len(name.split("/")[0]) + 1):
        return name
    raise ValueError(f"unknown metric {name!r}; valid: {', '.join(sorted(METRICS))}, "
                     f"and any {' or '.join(p + '*' for p in METRIC_PREFIXES)}")


_LOWER_IS_BETTER = ("quality/kl_", "quality/ppl_")


def higher_is_better(name: str) -> bool:
    return validate_metric(name).startswith(_HIGHER_IS_BETTER) and not name.startswith(_LOWER_IS_BETTER)


def _default_quality_margins() -> dict[str, float]:
    # From the seed campaign: BLEU within 0.3% and ROUGE within 0.5% of the control's, relative.
    return {"quality/bleu_vs_ref": 0.003, "quality/rouge1_vs_ref": 0.005,
            "quality/rouge2_vs_ref": 0.005, "quality/rougeL_vs_ref": 0.005}


def _default_agreement() -> dict[str, float]:
    # The same seed margins read against the control's own outputs: a candidate's text may drift from the
    # control's by at most 0.3% BLEU and 0.5% ROUGE-L. Lossy or not, a change that rewrites the answers
    # fails here even when its scores against the references happen not to drop.
    return {"quality/bleu_vs_control": 100.0 * (1 - 0.003), "quality/rougeL_vs_control": 1 - 0.005}


LOSSLESS_CHECKS = ("auto", "near_tie", "exact", "teacher_forced")
NEAR_TIE_TOP_K_MAX = 5  # what each run records per answer token (optladder/experiments/experiment.py TRACE_TOP_K)


@dataclass
class GateConfig:
    """The gates of one A/B. Relative numbers are fractions (0.10 = 10%).

    quality_margins_rel: non-inferiority, candidate >= control * (1 - margin), per *_vs_ref metric.
    min_exact_match_lossless: for a lossless candidate, the fraction of prompts whose output must
        equal the control's (quality/exact_match_vs_control).
    lossless_check: how a lossless candidate's quality is checked. near_tie: where its greedy answer parts from
        the control's, the token each arm chose must be within the other arm's top near_tie_top_k there and within
        near_tie_margin nats of its top token (optladder/quality/near_tie.py); an engine that records no
        log-probs makes it inconclusive. near_tie_max_drift_float32: where both arms compute in float32, the
        largest gap of a chosen token's log-prob between the arms before any fork must also stay within it
        (a lossless switch drifts by rounding only: 1.4e-5 nats for chunked_prefill on SmolLM2; a rotary position
        off by one in later chunks 0.28, though each of its forks is a near-tie); null: reported only. auto: near_tie where both arms recorded them, else teacher_forced in
        half precision and exact in float32. exact: its greedy answers must be the
        control's (min_exact_match_lossless, control_agreement_min). teacher_forced: on the teacher-forced
        gates, as a lossy candidate (its text gates reported), because in half precision a change of
        kernel or of batch composition changes the rounding, a near-tie flips one greedy token and the rest
        of the answer follows it: on the H200 with random bf16 weights flash_attn and dynamic_batching
        matched 0% of the control's answers. auto: teacher_forced where the arms compute in bfloat16 or
        float16, exact in float32.
    control_agreement_min: for every candidate, the least BLEU / ROUGE-L of its outputs scored against
        the control's outputs (how far its answers may drift from the control's).
    latency_gains: metric -> required relative improvement in its good direction (0.0: not worse;
        negative: that much regression allowed). Applies to throughput too (higher is better there).
    latency_max_regression: metric -> largest relative change in its bad direction that still passes.
        In every metric mapping a metric set to null is not gated (Hydra merges a dict given on the command line
        into the default one: `++gate.latency_max_regression={perf/e2e_ms_p99:null,perf/e2e_ms_p90:0.1}`).
    memory_ceilings_gb: metric -> ceiling on the candidate's value, in GB.
    min_pairs: fewer paired requests than this make a bootstrap gate inconclusive, because the
        percentile bootstrap understates the spread of tiny samples.
    run_noise: latency metric -> the SD of log(candidate / control) between identical runs, as an A/A
        sweep on the same kind of machine measured it (abtest/aa_summary.py prints it). A latency interval
        needs run-to-run noise: one run pair cannot show it, so without a prior here it needs ab.repeats >= 2.
    run_noise_weight: how many run pairs' worth the prior counts for, pooled with the pairs' own spread.
    environment_check: latency (default): when the arms' runs were measured on different machines, software or
        code (optladder/abtest/environment.py: host, boot, CPU, GPU, driver, versions, a digest of the code), the latency
        gates (which compare the arms) report instead of deciding, so the verdict cannot pass on latency (a
        ladder resumed on another machine); report: they decide, the difference is reported; ignore: not compared.
    kl_max_mean, kl_max_p99, top1_agree_min, ppl_max_rel_increase: the teacher-forced gates of a lossy
        candidate (optladder/abtest/teacher_forced.py), each on its bootstrap interval over prompts; null: not gated.
        The defaults are calibrated on SmolLM2 (benchmarks/results/lossy_cpu/README.md): float32 -> bfloat16 passes, a damaged model fails.
        When they decide, the text gates of a lossy candidate are reported: agreement with the control's
        answers does not decide, and a non-inferiority check against the references decides only by failing.
    """

    quality_margins_rel: dict[str, Optional[float]] = field(default_factory=_default_quality_margins)
    min_exact_match_lossless: float = 0.99
    lossless_check: str = "auto"
    near_tie_top_k: int = 5
    near_tie_margin: float = 1.0
    near_tie_max_drift_float32: Optional[float] = 0.01
    environment_check: str = "latency"
    control_agreement_min: dict[str, Optional[float]] = field(default_factory=_default_agreement)
    latency_gains: dict[str, Optional[float]] = field(default_factory=dict)
    latency_max_regression: dict[str, Optional[float]] = field(default_factory=lambda: {"perf/e2e_ms_p99": 0.10})
    memory_ceilings_gb: dict[str, Optional[float]] = field(default_factory=dict)
    alpha: float = 0.05
    n_boot: int = 2000
    min_pairs: int = 10
    run_noise: dict[str, Optional[float]] = field(default_factory=dict)
    run_noise_weight: float = 4.0
    seed: int = 0
    kl_max_mean: Optional[float] = 0.01
    kl_max_p99: Optional[float] = 0.1
    top1_agree_min: Optional[float] = 0.97
    ppl_max_rel_increase: Optional[float] = 0.02

    def teacher_forced_bounds(self) -> dict[str, float]:
        """Metric -> bound of each teacher-forced gate that is set (a floor for top-1 agreement)."""
        bounds = {"quality/kl_vs_control_mean": self.kl_max_mean, "quality/kl_vs_control_p99": self.kl_max_p99,
                  "quality/top1_agree_vs_control": self.top1_agree_min,
                  "quality/ppl_ref_rel_change": self.ppl_max_rel_increase}
        return {m: float(b) for m, b in bounds.items() if b is not None}

    def __post_init__(self) -> None:
        for key in METRIC_MAPPINGS:  # a metric set to null is not gated
            setattr(self, key, {k: v for k, v in getattr(self, key).items() if v is not None})
        for name, margin in self.quality_margins_rel.items():
            if not validate_metric(name).endswith("_vs_ref"):
                raise ValueError(
                    f"gate.quality_margins_rel: {name!r} has no control value to be non-inferior to; "
                    f"valid: {', '.join(sorted(m for m in METRICS if m.endswith('_vs_ref')))} "
                    f"(agreement with the control is gate.min_exact_match_lossless)")
            _check_range(f"gate.quality_margins_rel[{name!r}]", margin, 0.0, 1.0)
        for attr in ("latency_gains", "latency_max_regression"):
            for name, value in getattr(self, attr).items():
                if validate_metric(name).startswith("quality/"):
                    raise ValueError(f"gate.{attr}: {name!r} is a quality metric; "
                                     f"put it in gate.quality_margins_rel")
                # -1: anything goes; 10: an 11x throughput gain, beyond any real requirement
                _check_range(f"gate.{attr}[{name!r}]", value, -1.0, 10.0)
        for name, ceiling in self.memory_ceilings_gb.items():
            if not validate_metric(name).endswith("_gb"):
                raise ValueError(f"gate.memory_ceilings_gb: {name!r} is not a memory metric; valid: "
                                 f"{', '.join(sorted(m for m in METRICS if m.endswith('_gb')))}")
            if ceiling <= 0:
                raise ValueError(f"gate.memory_ceilings_gb[{name!r}] must be > 0 GB, got {ceiling}")
        _check_range("gate.min_exact_match_lossless", self.min_exact_match_lossless, 0.0, 1.0)
        if self.lossless_check not in LOSSLESS_CHECKS:
            raise ValueError(f"gate.lossless_check={self.lossless_check!r} is not one of "
                             f"{', '.join(LOSSLESS_CHECKS)}")
        check_mode(self.environment_check)
        if not (isinstance(self.near_tie_top_k, int) and 1 <= self.near_tie_top_k <= NEAR_TIE_TOP_K_MAX):
            raise ValueError(f"gate.near_tie_top_k must be an integer in [1, {NEAR_TIE_TOP_K_MAX}] (the log-probs a "
                             f"run records per answer token), got {self.near_tie_top_k!r}")
        _check_range("gate.near_tie_margin", self.near_tie_margin, 0.0, 100.0)
        if self.near_tie_max_drift_float32 is not None:
            _check_range("gate.near_tie_max_drift_float32", self.near_tie_max_drift_float32, 0.0, 100.0)
        for name, floor in self.control_agreement_min.items():
            if not validate_metric(name).endswith("_vs_control") or name.endswith("exact_match_vs_control"):
                raise ValueError(f"gate.control_agreement_min: {name!r} is not an agreement score; valid: "
                                 "quality/bleu_vs_control (0-100), quality/rougeL_vs_control (0-1)")
            _check_range(f"gate.control_agreement_min[{name!r}]", floor, 0.0, 100.0)
        for name, sd in self.run_noise.items():
            if not PAIRED_LATENCY.match(validate_metric(name)):
                raise ValueError(f"gate.run_noise: {name!r} has no per-request values to pair; valid: "
                                 "perf/{ttft,tpot,e2e}_ms_{mean,p50,p90,p99}")
            _check_range(f"gate.run_noise[{name!r}]", sd, 1e-6, 2.0)
        _check_range("gate.run_noise_weight", self.run_noise_weight, 0.0, 1e6)
        for name in ("kl_max_mean", "kl_max_p99", "ppl_max_rel_increase"):
            if getattr(self, name) is not None:
                _check_range(f"gate.{name}", getattr(self, name), 0.0, 100.0)
        if self.top1_agree_min is not None:
            _check_range("gate.top1_agree_min", self.top1_agree_min, 0.0, 1.0)
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"gate.alpha must be in (0, 1), got {self.alpha}")
        if self.n_boot < 1 or self.min_pairs < 1:
            raise ValueError(f"gate.n_boot and gate.min_pairs must be >= 1, "
                             f"got {self.n_boot} and {self.min_pairs}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "GateConfig":
        """From a plain dict (YAML or OmegaConf.to_container); missing keys keep their defaults."""
        d = dict(d or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"unknown gate key(s) {', '.join(map(repr, unknown))}; "
                             f"valid: {', '.join(known)}")
        for key in METRIC_MAPPINGS:
            if key in d:
                if not isinstance(d[key], dict):
                    raise ValueError(f"gate.{key} must be a mapping of metric -> number, got {d[key]!r}")
                # a metric set to null is not gated: on the command line a dict is merged into the default one,
                # so `++gate.latency_max_regression={perf/e2e_ms_p99:null,perf/e2e_ms_p90:0.1}` swaps the metric
                d[key] = {str(k): _number(f"gate.{key}[{k!r}]", v) for k, v in d[key].items() if v is not None}
        return cls(**d)


METRIC_MAPPINGS = ("quality_margins_rel", "latency_gains", "latency_max_regression", "memory_ceilings_gb",
                   "control_agreement_min", "run_noise")


def _number(what: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None


def _check_range(what: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ValueError(f"{what} must be in [{lo}, {hi}], got {value}")
