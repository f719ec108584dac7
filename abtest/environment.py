"""Were both arms measured on the same machine, with the same software and code?

An A/B that runs its arms in one process always is. A ladder resumed on another machine is not: rung 4 of the
H200 ladder ran in a later session than rung 3, on a fresh machine, and every stage the host times was slower
(decode step mean 25.7 -> 32.0 ms, scheduling 0.06 -> 0.09 ms) though the switch it added does not change a
decode-only step, whose eager cost is host-bound and flat in the batch size: most likely the machine. A latency change measured across two
machines cannot be told from the machines' difference, so the gates that compare latency stop deciding
(`gate.environment_check`) and the verdict says which fields differ.

Pure functions of the snapshots' `environment` (experiments/snapshot.py); no torch.
"""
from __future__ import annotations

from typing import Any

ENVIRONMENT_CHECKS = ("latency", "report", "off")
# The fields that make two measurements comparable: the machine, what drives its accelerator, the software, the
# code. Not compared: cpu_threads (a setting, in the resolved config's effect), cuda_visible_devices (which GPU
# of a host a launcher granted: identical GPUs by `gpu`).
MACHINE = ("host", "boot_id", "cpu_model", "cpu_count", "gpu", "gpu_uuid", "gpu_count", "driver")
SOFTWARE = ("python", "platform", "torch_cuda")
CODE = ("git_commit", "git_dirty")


def _flat(env: dict[str, Any]) -> dict[str, Any]:
    out = {k: env.get(k) for k in (*MACHINE, *SOFTWARE, *CODE) if k in env}
    for name, version in (env.get("packages") or {}).items():
        out[f"packages.{name}"] = version
    return out


def differences(control: dict[str, Any] | None, candidate: dict[str, Any] | None) -> list[str]:
    """'field: control value != candidate value' for every compared field recorded in both environments and
    different; a field one of them did not record (an older snapshot) is not counted as a difference."""
    a, b = _flat(control or {}), _flat(candidate or {})
    return [f"{k}: {a[k]} != {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]


def across_runs(control: list[dict[str, Any]], candidate: list[dict[str, Any]]) -> list[str]:
    """The differences between the control's first run and every other run of either arm (repeats that ran
    elsewhere count too), each difference once."""
    runs = [e for e in (*control, *candidate) if e]
    if len(runs) < 2:
        return []
    seen: dict[str, None] = {}
    for env in runs[1:]:
        for d in differences(runs[0], env):
            seen.setdefault(d, None)
    return list(seen)


def check_mode(mode: str) -> str:
    if mode not in ENVIRONMENT_CHECKS:
        raise ValueError(f"gate.environment_check={mode!r} is not one of {', '.join(ENVIRONMENT_CHECKS)} "
                         "(latency: the latency gates stop deciding when the arms ran on different machines "
                         "or code; report: say so, decide anyway; off: not compared)")
    return mode


def describe(diffs: list[str], limit: int = 6) -> str:
    shown = "; ".join(diffs[:limit])
    more = f"; and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return f"the arms ran in different environments ({shown}{more})"
