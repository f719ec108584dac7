"""Is a candidate lossless against its control? Decided on the two resolved configs as plain dicts."""
from __future__ import annotations

from abtest.lossless import arms_lossless, leaves

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
    assert arms_lossless(BASE, BASE) == (True, "lossless: differs only in nothing")
    assert arms_lossless(BASE, with_(engine__paged_kv=True, engine__batch_size=4)) == (
        True, "lossless: differs only in engine.batch_size, engine.paged_kv")


def test_the_piecewise_cap_is_a_scheduling_knob_even_against_a_control_recorded_before_it_existed():
    before = {k: v for k, v in BASE.items()}
    before["engine"] = {k: v for k, v in BASE["engine"].items() if k != "piecewise_max_tokens"}
    cand = with_(engine__piecewise_max_tokens=1024)
    assert arms_lossless(before, cand)[0] and arms_lossless(BASE, cand)[0]


def test_tracking_progress_and_the_arm_selection_do_not_count():
    cand = with_(tracking__uri="b", replay__progress=False, ab={"name": "x"})
    assert arms_lossless(BASE, cand) == (True, "lossless: differs only in nothing")


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
    from abtest.lossless import lossless_check

    assert lossless_check("auto", ("float32", "float32"))[0] == "exact"
    check, why = lossless_check("auto", ("bfloat16", "bfloat16"))
    assert check == "teacher_forced" and "bfloat16" in why
    assert lossless_check("auto", ("float32", "float16"))[0] == "teacher_forced"
    assert lossless_check("exact", ("bfloat16", "bfloat16"))[0] == "exact"
    assert lossless_check("teacher_forced", ("float32", "float32"))[0] == "teacher_forced"


def test_teacher_forcing_covers_only_the_switches_its_pass_runs():
    from abtest.lossless import teacher_forcing_covers

    assert teacher_forcing_covers(BASE, with_(engine__flash_attn=True, engine__paged_kv=True))
    assert teacher_forcing_covers(BASE, BASE)
    assert not teacher_forcing_covers(BASE, with_(engine__flash_attn=True, engine__batch_size=4))
    assert not teacher_forcing_covers(BASE, with_(engine__cuda_graphs=True))
    assert teacher_forcing_covers(BASE, with_(tracking__uri="b"))  # what the arms log to is no difference


def test_an_arms_dtype_as_this_host_resolves_it_or_as_written():
    from experiments.ab_run import resolved_dtype

    assert resolved_dtype({"engine": {"name": "reference", "dtype": "auto", "device": "cpu"}}) == "float32"
    assert resolved_dtype({"engine": {"name": "reference", "dtype": "bfloat16", "device": "cpu"}}) == "bfloat16"
    # an endpoint elsewhere: what its config says, never this host's default; a value this host cannot resolve
    assert resolved_dtype({"engine": {"name": "openai", "dtype": "auto", "device": "cuda"}}) == "auto"
    assert resolved_dtype({"engine": {"name": "reference", "dtype": "bf16", "device": "auto"}}) == "bf16"
