"""Is a candidate lossless against its control? Decided on the two resolved configs as plain dicts."""
from __future__ import annotations

from optladder.abtest.lossless import arms_lossless, leaves

BASE = {"engine": {"name": "reference", "paged_kv": False, "flash_attn": False, "dtype": "auto", "batch_size": 8,
                   "server": {"extra_args": []}},
        "tracking": {"uri": "a"}, "replay": {"progress": True}, "seed": 0}


def with_(**changes) -> dict:
    out = {**BASE, "engine": {**BASE["engine"]}}
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            out[section] = {**out.get(section, {}), name: value}
        else:
            out[section] = value
    return out


def test_leaves_flatten_nested_dicts_and_keep_lists_and_empty_dicts():
    assert leaves({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}, "f": None}) == {"a.b": 1, "a.c.d": [1, 2], "e": {},
                                                                             "f": None}


def test_lossless_opts_and_scheduling_knobs_keep_a_candidate_lossless():
    assert arms_lossless(BASE, BASE) == (True, "lossless: the arms' configs are identical")
    assert arms_lossless(BASE, with_(engine__paged_kv=True, engine__batch_size=4)) == (
        True, "lossless: the arms differ only in engine.batch_size, engine.paged_kv")


def test_the_piecewise_cap_is_a_scheduling_knob_even_against_a_control_recorded_before_it_existed():
    before = {k: v for k, v in BASE.items()}
    before["engine"] = {k: v for k, v in BASE["engine"].items() if k != "piecewise_max_tokens"}
    cand = with_(engine__piecewise_max_tokens=1024)
    assert arms_lossless(before, cand)[0] and arms_lossless(BASE, cand)[0]


def test_tracking_progress_and_the_arm_selection_do_not_count():
    cand = with_(tracking__uri="b", replay__progress=False, ab={"name": "x"})
    assert arms_lossless(BASE, cand) == (True, "lossless: the arms' configs are identical")


def test_any_other_difference_is_lossy_and_named_with_both_values():
    assert arms_lossless(BASE, with_(engine__dtype="bfloat16", engine__paged_kv=True)) == (
        False, "lossy: engine.dtype=auto->bfloat16")
    assert arms_lossless(BASE, with_(engine__name="vllm", seed=1)) == (
        False, "lossy: engine.name=reference->vllm, seed=0->1")
    # a key only one side has is a difference too (a value against nothing)
    assert arms_lossless(BASE, with_(engine__quant="int8")) == (False, "lossy: engine.quant=None->int8")
    assert arms_lossless(with_(engine__quant="int8"), BASE) == (False, "lossy: engine.quant=int8->None")
    assert arms_lossless(BASE, with_(engine__server={"extra_args": ["--x"]})) == (
        False, "lossy: engine.server.extra_args=[]->['--x']")


def test_auto_checks_half_precision_teacher_forced_and_float32_exactly():
    from optladder.abtest.lossless import lossless_check

    assert lossless_check("auto", ("float32", "float32"), "no traces")[0] == "exact"
    check, why = lossless_check("auto", ("bfloat16", "bfloat16"), "no traces")
    assert check == "teacher_forced" and "bfloat16" in why
    assert lossless_check("auto", ("float32", "float16"), "no traces")[0] == "teacher_forced"
    assert lossless_check("exact", ("bfloat16", "bfloat16"))[0] == "exact"
    assert lossless_check("teacher_forced", ("float32", "float32"))[0] == "teacher_forced"


def test_teacher_forcing_covers_only_the_switches_its_pass_runs():
    from optladder.abtest.lossless import teacher_forcing_covers

    assert teacher_forcing_covers(BASE, with_(engine__flash_attn=True, engine__paged_kv=True))
    assert teacher_forcing_covers(BASE, BASE)
    assert not teacher_forcing_covers(BASE, with_(engine__flash_attn=True, engine__batch_size=4))
    assert not teacher_forcing_covers(BASE, with_(engine__cuda_graphs=True))
    assert teacher_forcing_covers(BASE, with_(tracking__uri="b"))  # what the arms log to is no difference


def test_an_arms_dtype_as_this_host_resolves_it_or_as_written():
    from optladder.experiments.ab_run import resolved_dtype

    assert resolved_dtype({"engine": {"name": "reference", "dtype": "auto", "device": "cpu"}}) == "float32"
    assert resolved_dtype({"engine": {"name": "reference", "dtype": "bfloat16", "device": "cpu"}}) == "bfloat16"
    # an endpoint elsewhere: what its config says, never this host's default; a value this host cannot resolve
    assert resolved_dtype({"engine": {"name": "openai", "dtype": "auto", "device": "cuda"}}) == "auto"
    assert resolved_dtype({"engine": {"name": "reference", "dtype": "bf16", "device": "auto"}}) == "bf16"


def _ab_arm(name: str) -> tuple[dict, dict]:
    """(resolved config, opts_effective) of an arm of the engine A/B the H200 ran."""
    import json
    from pathlib import Path

    arm = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu_ab_vllm_h200" / f"{name}-r0"
    snap = json.loads((arm / "config_snapshot.json").read_text())
    return snap["resolved_config"], json.loads((arm / "summary.json").read_text())["opts_effective"]


def test_an_opt_in_effect_in_one_arm_only_is_named():
    """The H200's engine A/B: vLLM fuses whatever fused_kernels says, the reference control ran without it."""
    from optladder.abtest.lossless import opts_in_effect_differ

    (ctl, ctl_eff), (cand, cand_eff) = _ab_arm("control"), _ab_arm("candidate")
    found = opts_in_effect_differ(ctl, cand, ctl_eff, cand_eff)
    assert len(found) == 1 and found[0].startswith("fused_kernels: in effect in the candidate only (always_on)")
    assert "engine.fused_kernels=False" in found[0]
    # the same opt on in both arms: nothing to say
    fused = {**ctl_eff, "fused_kernels": {**ctl_eff["fused_kernels"], "on": True}}
    assert opts_in_effect_differ(ctl, cand, fused, cand_eff) == []
    # an engine that cannot say whether it is on (an endpoint): not reported
    unknown = {**cand_eff, "fused_kernels": {**cand_eff["fused_kernels"], "on": None}}
    assert opts_in_effect_differ(ctl, cand, ctl_eff, unknown) == []


def test_the_opt_an_ab_asks_about_is_not_reported():
    from optladder.abtest.lossless import opts_in_effect_differ

    ctl, ctl_eff = _ab_arm("control")
    cand = {**ctl, "engine": {**ctl["engine"], "fused_kernels": True}}  # +ab with +opt=fused_kernels in the candidate
    cand_eff = {**ctl_eff, "fused_kernels": {**ctl_eff["fused_kernels"], "on": True}}
    assert opts_in_effect_differ(ctl, cand, ctl_eff, cand_eff) == []
    assert opts_in_effect_differ(ctl, ctl, ctl_eff, cand_eff)[0].startswith("fused_kernels: in effect in the candidate")
