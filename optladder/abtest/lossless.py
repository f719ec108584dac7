"""Is a candidate lossless against its control? Only when every difference between the two resolved
configs is a lossless opt (optladder/engine/opts.py) or a scheduling knob that changes when tokens are computed,
never what they are. Then the gates also demand the control's exact outputs.

Plain data in: the two resolved configs as nested dicts (what `OmegaConf.to_container(cfg, resolve=True)`
gives). Values are compared as they are, never through a string form that could truncate or collide."""
from __future__ import annotations

from typing import Any

from optladder.engine.opts import OPTS

SCHEDULING = {"engine.batch_size", "engine.batch_timeout_ms", "engine.max_num_seqs", "engine.max_num_batched_tokens",
              "engine.block_size", "engine.kv_cache_gb", "engine.kv_cache_memory_fraction",
              "engine.piecewise_max_tokens",  # which steps replay piecewise_graphs' pieces, not what they compute
              "faults.step_slowdown",  # a test-only delay after each step: later tokens, the same ones
              "engine.debug_plant"}  # a test-only bug planted in a lossless switch: the check must catch it
IGNORED = ("tracking.", "replay.progress", "ab.", "ladder.")
_MISSING = object()


def leaves(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"a.b.c": value}; lists and scalars are leaves, kept as they are."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The leaf keys whose values differ between two flattened configs (leaves()), what is ignored left out."""
    return sorted(k for k in set(a) | set(b) if a.get(k, _MISSING) != b.get(k, _MISSING) and not k.startswith(IGNORED))


def arms_lossless(control: dict[str, Any], candidate: dict[str, Any]) -> tuple[bool, str]:
    a, b = leaves(control), leaves(candidate)
    diff = differences(a, b)
    lossless_fields = tuple(f"engine.{s.field}" for s in OPTS.values() if s.lossless)
    # an opt's field may be a settings group (engine.speculative.method, ...): all its keys are the opt's
    lossy = [k for k in diff if k not in SCHEDULING and k not in lossless_fields
             and not k.startswith(tuple(f + "." for f in lossless_fields))]
    if lossy:
        return False, f"lossy: {', '.join(f'{k}={a.get(k)}->{b.get(k)}' for k in lossy)}"
    if not diff:
        return True, "lossless: the arms' configs are identical"
    return True, f"lossless: the arms differ only in {', '.join(diff)}"


HALF = ("bfloat16", "float16")
# the switches the teacher-forced pass runs (optladder/engine/scoring.py: the model's varlen step over the KV blocks);
# decode steps, graphs, the scheduler and the detokenizer it never runs
SCORED = {"engine.paged_kv", "engine.flash_attn", "engine.fused_kernels", "engine.block_size"}


def teacher_forcing_covers(control: dict[str, Any], candidate: dict[str, Any]) -> bool:
    """Whether every difference between the arms is one the teacher-forced pass runs."""
    return set(differences(leaves(control), leaves(candidate))) <= SCORED


def lossless_check(mode: str, dtypes: tuple[str, str], no_traces: str | None = None) -> tuple[str, str]:
    """How a lossless candidate is checked (gate.lossless_check) given the arms' resolved dtypes and, where an arm
    recorded no log-probs of its answers, why (no_traces): ("near_tie" | "exact" | "teacher_forced", why). auto:
    near_tie wherever both arms recorded their answers' top-k log-probs (any dtype: in float32 too a kernel can
    flip an exact tie), else as before: teacher_forced in half precision, exact in float32."""
    if mode != "auto":
        return mode, f"gate.lossless_check={mode}"
    if no_traces is None:
        return "near_tie", "each fork of the greedy answers judged by both arms' top-k log-probs there"
    half = [d for d in dtypes if d in HALF]
    if half:
        return "teacher_forced", (f"no near-tie check ({no_traces}); {half[0]} rounds differently with the kernel "
                                  f"and the batch: greedy answers diverge after a near-tie, so they are compared "
                                  f"teacher-forced")
    return "exact", f"no near-tie check ({no_traces}); {dtypes[0]}: the control's exact answers"


def opts_in_effect_differ(control: dict[str, Any], candidate: dict[str, Any], control_effective: dict[str, dict],
                          candidate_effective: dict[str, dict]) -> list[str]:
    """Opts in effect in one arm and not in the other although both arms' configs set them alike: a difference the
    A/B did not ask for, which its latency verdict then includes. The case it was written for: an engine A/B whose
    control is the reference engine without fused_kernels, against vLLM, whose torch.compile fuses whatever the
    switch says (opts_effective state always_on); on the H200 the control's decode steps took 9.6 ms where the
    fused ones take ~5 (benchmarks/results/gpu_ab_vllm_h200/). control / candidate: the resolved configs;
    *_effective: each arm's opts_effective. An opt whose field the configs set differently is the A/B's own
    question, not reported; an engine that cannot say (on: None, engine=openai) is not either."""
    flat = leaves(control)
    asked = set(differences(flat, leaves(candidate)))
    out = []
    for opt in sorted(set(control_effective) & set(candidate_effective)):
        a, b = control_effective[opt].get("on"), candidate_effective[opt].get("on")
        spec = OPTS.get(opt)
        if a is None or b is None or bool(a) == bool(b) or spec is None:
            continue
        field = f"engine.{spec.field}"
        if field in asked or any(k.startswith(field + ".") for k in asked):
            continue
        on_arm, on_ev = ("candidate", candidate_effective[opt]) if b else ("control", control_effective[opt])
        state = on_ev.get("state")
        out.append(f"{opt}: in effect in the {on_arm} only{f' ({state})' if state else ''}, though both arms set "
                   f"{field}={flat.get(field)}; turn it on in both (+opt={opt}) or read the latency "
                   "verdict as including it")
    return out
