"""A/B comparison: paired statistics, gates, verdicts and rollout plans.

The decision core here is plain bookkeeping (no torch, no Hydra); the orchestration that runs the
arms (optladder/experiments/ab_run.py) builds `ArmResult`s and calls `decide`.
"""
from optladder.abtest.gates import GateConfig, higher_is_better, validate_metric
from optladder.abtest.rollout import current, promote, rollback, rollout_plan
from optladder.abtest.run_pairs import PairInterval, align_runs, pair_interval
from optladder.abtest.stats import Interval, bootstrap_mean_delta
from optladder.abtest.verdict import ArmResult, GateResult, Verdict, decide

__all__ = ["ArmResult", "GateConfig", "GateResult", "Interval", "PairInterval", "Verdict", "align_runs",
           "bootstrap_mean_delta", "current", "decide", "higher_is_better", "pair_interval", "promote",
           "rollback", "rollout_plan", "validate_metric"]
