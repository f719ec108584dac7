"""Were both arms measured on the same machine, with the same software and code?

An A/B that runs its arms in one process always is. A ladder resumed on another machine is not: rung 4 of the
H200 ladder ran in a later session than rung 3, on a fresh machine, and every stage the host times was slower
(decode-only step mean 25.7 -> 32.0 ms; per sampled sequence, sampling +13%, detokenizing +20%) though the
switch it added changes none of them: most likely the machine. A latency change measured across two
machines cannot be told from the machines' difference, so the gates that compare latency stop deciding
(`gate.environment_check`) and the verdict says which fields differ.

Pure functions of the snapshots' `environment` (optladder/experiments/snapshot.py); no torch.
"""
from __future__ import annotations

from typing import Any

ENVIRONMENT_CHECKS = ("latency", "report", "ignore")  # not "off": YAML reads an unquoted off as false
# The fields that make two measurements comparable: the machine, what drives its accelerator, the software, the
# code. Not compared: cpu_threads (a setting, in the resolved config's effect), cuda_visible_devices (which of a
# host's GPUs a launcher granted: the GPU itself is told by its UUID).
MACHINE = ("host", "boot_id", "cpu_model", "cpu_count", "gpu", "gpu_uuid", "gpu_count", "driver", "cuda_available")
SOFTWARE = ("python", "platform", "torch_cuda")
# code_id: a digest of the source files under the code directories as on disk (optladder/experiments/snapshot.py), so a
# commit of documents changes nothing; snapshots from before it have only the commit and the dirty flag
CODE = ("code_id",)
OLD_CODE = ("git_commit", "git_dirty")
# recorded by one side only: the machine cannot be shown to be the same (a snapshot from before these were kept)
IDENTITY = ("host", "boot_id", "gpu_uuid")


def _flat(env: dict[str, Any]) -> dict[str, Any]:
    out = {k: env.get(k) for k in (*MACHINE, *SOFTWARE, *CODE, *OLD_CODE) if env.get(k) is not None}
    for name, version in (env.get("packages") or {}).items():
        out[f"packages.{name}"] = version
    return out


def differences(control: dict[str, Any] | None, candidate: dict[str, Any] | None) -> list[str]:
    """'field: control value != candidate value' for every compared field recorded in both environments and
    different. Two runs of one process never differ (the `process` token; what a process measured of itself,
    e.g. a git status during an edit, cannot make its own runs incomparable). A value that could not be read
    (None) or that one side did not record is no difference, except a machine identity (host, boot id, GPU
    UUID) recorded by one side only: then the machine is not known to be the same ("not recorded")."""
    control, candidate = control or {}, candidate or {}
    if control.get("process") and control.get("process") == candidate.get("process"):
        return []
    a, b = _flat(control), _flat(candidate)
    if "code_id" in a and "code_id" in b:
        a, b = ({k: v for k, v in x.items() if k not in OLD_CODE} for x in (a, b))
    else:
        a.pop("code_id", None), b.pop("code_id", None)
    out = [f"{k}: {a[k]} != {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    out += [f"{k}: {a.get(k, 'not recorded')} != {b.get(k, 'not recorded')}"
            for k in IDENTITY if (k in a) != (k in b)]
    return out


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
                         "or code; report: say so, decide anyway; ignore: not compared)")
    return mode


def describe(diffs: list[str], limit: int = 6) -> str:
    shown = "; ".join(diffs[:limit])
    more = f"; and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return f"the arms ran in different environments ({shown}{more})"
