"""A/B comparison: paired statistics, gates, verdicts and rollout plans.

The decision core here is plain bookkeeping (no torch, no Hydra); the orchestration that runs the
arms (experiments/ab_run.py) builds `ArmResult`s and calls `decide`.
"""
from abtest.gates import GateConfig, higher_is_better, validate_metric
from abtest.rollout import current, promote, rollback, rollout_plan
from abtest.stats import (Interval, bootstrap_mean_delta, bootstrap_quantile_delta, pair_records,
                          pool_repeats)
from abtest.verdict import ArmResult, GateResult, Verdict, decide

__all__ = ["ArmResult", "GateConfig", "GateResult", "Interval", "Verdict", "bootstrap_mean_delta",
           "bootstrap_quantile_delta", "current", "decide", "higher_is_better", "pair_records",
           "pool_repeats", "promote", "rollback", "rollout_plan", "validate_metric"]
