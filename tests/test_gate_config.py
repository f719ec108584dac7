"""The gate settings and the metric names they may name: every mistake refused with the field, the bad value
and what would be valid; the metric contract of DESIGN.md exactly."""
from __future__ import annotations

import re

import pytest

from optladder.abtest.gates import METRICS, GateConfig, _metric_names, higher_is_better, validate_metric

CONTRACT = ({f"perf/{m}_ms_{s}" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p99", "p999")}
            | {"perf/throughput_req_s", "perf/throughput_out_tok_s", "perf/goodput_req_s", "perf/peak_mem_gb",
               "perf/kv_reserved_gb", "perf/kv_used_gb", "perf/kv_util", "perf/lateness_ms_p50", "perf/lateness_ms_p99",
               "perf/requests_ok", "perf/requests_failed", "perf/makespan_s", "traffic/ks_input_len",
               "traffic/ks_output_len", "quality/bleu_vs_ref", "quality/rouge1_vs_ref", "quality/rouge2_vs_ref",
               "quality/rougeL_vs_ref", "quality/bleu_vs_control", "quality/rougeL_vs_control",
               "quality/exact_match_vs_control", "quality/kl_vs_control_mean", "quality/kl_vs_control_p99",
               "quality/top1_agree_vs_control", "quality/ppl_ref_rel_change"})
# the near-tie lossless check's counts (optladder/quality/near_tie.py)
CONTRACT |= {f"quality/near_tie_{m}" for m in ("equal", "diverged", "not_near", "worst_margin", "max_drift")}


def test_the_metric_names_are_the_contract():
    assert _metric_names() == CONTRACT == METRICS


@pytest.mark.parametrize("name, ok", [("capacity/max_concurrency", True), ("stage/decode_ms_mean", True),
                                      ("capacity/", False), ("stage/x", True), ("perf/ttft_ms_p42", False)])
def test_named_families_take_any_suffix_but_not_none(name, ok):
    if ok:
        assert validate_metric(name) == name
    else:
        with pytest.raises(ValueError, match=re.escape(f"unknown metric {name!r}; valid: perf/e2e_ms_mean, ")):
            validate_metric(name)


def test_unknown_metric_lists_the_families_too():
    with pytest.raises(ValueError, match=re.escape("quality/top1_agree_vs_control, traffic/ks_input_len, "
                                                   "traffic/ks_output_len, and any capacity/* or stage/*")):
        validate_metric("nope")


@pytest.mark.parametrize("name, higher", [("perf/throughput_req_s", True), ("perf/kv_util", True),
                                          ("capacity/max_rate_req_s", True), ("quality/bleu_vs_ref", True),
                                          ("perf/e2e_ms_p99", False), ("perf/lateness_ms_p99", False),
                                          ("stage/decode_ms_mean", False), ("perf/requests_failed", False)])
def test_direction_of_every_family(name, higher):
    assert higher_is_better(name) is higher


@pytest.mark.parametrize("kwargs, message", [
    ({"quality_margins_rel": {"quality/bleu_vs_control": 0.1}},
     "gate.quality_margins_rel: 'quality/bleu_vs_control' has no control value to be non-inferior to; valid: "
     "quality/bleu_vs_ref, quality/rouge1_vs_ref, quality/rouge2_vs_ref, quality/rougeL_vs_ref (agreement with "
     "the control is gate.min_exact_match_lossless)"),
    ({"quality_margins_rel": {"perf/e2e_ms_p99": 0.1}}, "'perf/e2e_ms_p99' has no control value"),
    ({"quality_margins_rel": {"quality/bleu_vs_ref": 1.5}},
     "gate.quality_margins_rel['quality/bleu_vs_ref'] must be in [0.0, 1.0], got 1.5"),
    ({"latency_gains": {"quality/bleu_vs_ref": 0.1}},
     "gate.latency_gains: 'quality/bleu_vs_ref' is a quality metric; put it in gate.quality_margins_rel"),
    ({"latency_max_regression": {"perf/e2e_ms_p99": -1.5}},
     "gate.latency_max_regression['perf/e2e_ms_p99'] must be in [-1.0, 10.0], got -1.5"),
    ({"latency_gains": {"perf/throughput_req_s": 10.5}}, "must be in [-1.0, 10.0], got 10.5"),
    ({"memory_ceilings_gb": {"perf/e2e_ms_p99": 1}},
     "gate.memory_ceilings_gb: 'perf/e2e_ms_p99' is not a memory metric; valid: perf/kv_reserved_gb, "
     "perf/kv_used_gb, perf/peak_mem_gb"),
    ({"memory_ceilings_gb": {"perf/peak_mem_gb": 0}}, "gate.memory_ceilings_gb['perf/peak_mem_gb'] must be > 0 GB, got 0"),
    ({"min_exact_match_lossless": 1.01}, "gate.min_exact_match_lossless must be in [0.0, 1.0], got 1.01"),
    ({"min_exact_match_lossless": -0.01}, "gate.min_exact_match_lossless must be in [0.0, 1.0], got -0.01"),
    ({"control_agreement_min": {"quality/exact_match_vs_control": 1}},
     "gate.control_agreement_min: 'quality/exact_match_vs_control' is not an agreement score; valid: "
     "quality/bleu_vs_control (0-100), quality/rougeL_vs_control (0-1)"),
    ({"control_agreement_min": {"quality/bleu_vs_ref": 1}}, "'quality/bleu_vs_ref' is not an agreement score"),
    ({"control_agreement_min": {"quality/bleu_vs_control": 100.5}},
     "gate.control_agreement_min['quality/bleu_vs_control'] must be in [0.0, 100.0], got 100.5"),
    ({"alpha": 0.0}, "gate.alpha must be in (0, 1), got 0.0"),
    ({"alpha": 1.0}, "gate.alpha must be in (0, 1), got 1.0"),
    ({"n_boot": 0}, "gate.n_boot and gate.min_pairs must be >= 1, got 0 and 10"),
    ({"min_pairs": 0}, "gate.n_boot and gate.min_pairs must be >= 1, got 2000 and 0"),
])
def test_bad_gate_settings_are_refused_with_the_field_value_and_valid_ones(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GateConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"quality_margins_rel": {"quality/bleu_vs_ref": 0.0}}, {"quality_margins_rel": {"quality/bleu_vs_ref": 1.0}},
    {"latency_max_regression": {"perf/e2e_ms_p99": -1.0}}, {"latency_gains": {"perf/throughput_req_s": 10.0}},
    {"min_exact_match_lossless": 0.0}, {"min_exact_match_lossless": 1.0}, {"n_boot": 1, "min_pairs": 1},
    {"control_agreement_min": {"quality/bleu_vs_control": 100.0}}, {"memory_ceilings_gb": {"perf/kv_used_gb": 0.5}},
    {"alpha": 0.5}])
def test_the_edges_of_every_range_are_allowed(kwargs):
    GateConfig(**kwargs)


def test_from_dict_converts_numbers_and_refuses_what_it_cannot():
    cfg = GateConfig.from_dict({"latency_max_regression": {"perf/e2e_ms_p99": "0.2"}, "memory_ceilings_gb":
                                {"perf/peak_mem_gb": 40}, "control_agreement_min": {"quality/bleu_vs_control": 90},
                                "quality_margins_rel": {"quality/bleu_vs_ref": "0.01"}, "latency_gains":
                                {"perf/throughput_req_s": "0.1"}})
    assert cfg.latency_max_regression == {"perf/e2e_ms_p99": 0.2} and cfg.memory_ceilings_gb == {"perf/peak_mem_gb": 40.0}
    assert cfg.quality_margins_rel == {"quality/bleu_vs_ref": 0.01} and cfg.latency_gains == {"perf/throughput_req_s": 0.1}
    assert cfg.control_agreement_min == {"quality/bleu_vs_control": 90.0}
    assert GateConfig.from_dict(None) == GateConfig()
    with pytest.raises(ValueError, match=re.escape("unknown gate key(s) 'alfa', 'nboot'; valid: quality_margins_rel, "
                                                   "min_exact_match_lossless, lossless_check, near_tie_top_k, near_tie_margin, near_tie_max_drift_float32, "
                                                   "environment_check, "
                                                   "control_agreement_min")):
        GateConfig.from_dict({"alfa": 0.1, "nboot": 5})
    with pytest.raises(ValueError, match=re.escape("gate.latency_gains must be a mapping of metric -> number, got [1]")):
        GateConfig.from_dict({"latency_gains": [1]})
    with pytest.raises(ValueError, match=re.escape("gate.memory_ceilings_gb['perf/peak_mem_gb'] must be a number, "
                                                   "got 'lots'")):
        GateConfig.from_dict({"memory_ceilings_gb": {"perf/peak_mem_gb": "lots"}})


def test_null_drops_a_metric_from_a_gate_and_a_value_must_still_be_a_number():
    from omegaconf import OmegaConf

    from tests.conftest import compose_config

    cfg = compose_config(["++gate.latency_max_regression={perf/e2e_ms_p99:null,perf/e2e_ms_p90:0.1}"])
    gate = GateConfig.from_dict(OmegaConf.to_container(cfg.gate, resolve=True))
    assert "perf/e2e_ms_p99" not in gate.latency_max_regression
    assert gate.latency_max_regression["perf/e2e_ms_p90"] == 0.1
    default = GateConfig.from_dict(OmegaConf.to_container(compose_config([]).gate, resolve=True))
    assert "perf/e2e_ms_p99" in default.latency_max_regression  # the default gates p99; only the null removed it
    # the dict is merged into the default one, not put in its place: a new key alone keeps the default p99
    added = compose_config(["++gate.latency_max_regression={perf/e2e_ms_p90:0.2}"])
    assert GateConfig.from_dict(OmegaConf.to_container(added.gate, resolve=True)).latency_max_regression == {
        **default.latency_max_regression, "perf/e2e_ms_p90": 0.2}
    for key in ("latency_gains", "memory_ceilings_gb", "quality_margins_rel"):
        assert GateConfig(**{key: {"perf/peak_mem_gb" if key == "memory_ceilings_gb" else
                                   "quality/bleu_vs_ref" if key == "quality_margins_rel" else
                                   "perf/throughput_req_s": None}}).__dict__[key] == {}
    with pytest.raises(ValueError, match=re.escape("gate.latency_max_regression['perf/e2e_ms_p90'] must be a number, "
                                                   "got 'fast'")):
        GateConfig.from_dict({"latency_max_regression": {"perf/e2e_ms_p99": None, "perf/e2e_ms_p90": "fast"}})
