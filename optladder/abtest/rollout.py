"""What a passing verdict leads to: a staged rollout plan, and the registry of promoted baselines.

The plan is data (traffic weights, the gates to re-check at each stage) for a rollout controller to
follow. The registry is the one piece of abtest/ that does I/O: plain JSON files in a directory the
caller names. `history.jsonl` is an append-only log of promotions and rollbacks, so the audit trail
survives a rollback; `current.json` is the promoted baseline now in force.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

from optladder.abtest.verdict import Verdict
from optladder.paths import PROJECT_ROOT

# where promoted baselines are kept unless the caller names another folder: <project>/rollouts
DEFAULT_REGISTRY = PROJECT_ROOT / "rollouts"
HISTORY = "history.jsonl"
CURRENT = "current.json"


def rollout_plan(verdict: Verdict, candidate_name: str, stages: Sequence[float] = (1, 5, 25, 50, 100),
                 gate_names: Sequence[str] | None = None) -> dict[str, Any]:
    """Staged traffic weights (percent to the candidate), each stage re-checking gate_names (default:
    every gate of the verdict, as '<gate>:<metric>'). Only a passing verdict gets a plan."""
    if verdict.status != "pass":
        raise ValueError(f"no rollout plan for a verdict of {verdict.status!r}; only 'pass' rolls out")
    weights = [int(s) if float(s).is_integer() else float(s) for s in stages]
    if not weights or any(not 0 < w <= 100 for w in weights) or weights != sorted(set(weights)):
        raise ValueError(f"rollout stages must be strictly increasing percentages in (0, 100], got "
                         f"{list(stages)}")
    if weights[-1] != 100:
        raise ValueError(f"rollout stages must end at 100 (full rollout), got {list(stages)}")
    recheck = list(gate_names) if gate_names is not None else [g.name for g in verdict.gates if g.decides]
    return {
        "candidate": candidate_name,
        "control": verdict.control,
        "verdict": verdict.status,
        "stages": [{"stage": i + 1, "candidate_weight_pct": w, "control_weight_pct": 100 - w,
                    "recheck_gates": recheck, "on_fail": "rollback"}
                   for i, w in enumerate(weights)],
    }


def _read_history(registry_dir: Path) -> list[dict[str, Any]]:
    path = registry_dir / HISTORY
    if not path.exists():
        return []
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _stack(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The promotions still in force, oldest first: each rollback undoes the latest one."""
    stack: list[dict[str, Any]] = []
    for e in events:
        if e["event"] == "promote":
            stack.append(e["entry"])
        elif e["event"] == "rollback":
            stack.pop()
    return stack


def _append(registry_dir: Path, event: dict[str, Any]) -> None:
    with (registry_dir / HISTORY).open("a") as f:
        f.write(json.dumps(event, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _write_current(registry_dir: Path, entry: dict[str, Any]) -> None:
    # write-then-rename: a crash mid-write never leaves a half-written current baseline
    tmp = registry_dir / (CURRENT + ".tmp")
    tmp.write_text(json.dumps(entry, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, registry_dir / CURRENT)


def promote(registry_dir: str | Path, snapshot: dict[str, Any], run_id: str, name: str) -> Path:
    """Record snapshot (the candidate's config snapshot) as the promoted baseline; returns current.json."""
    if not run_id or not name:
        raise ValueError(f"promote needs a run_id and a name, got run_id={run_id!r}, name={name!r}")
    if not isinstance(snapshot, dict):
        raise ValueError(f"promote needs the config snapshot as a dict, got {type(snapshot).__name__}")
    d = Path(registry_dir)
    d.mkdir(parents=True, exist_ok=True)
    entry = {"run_id": run_id, "name": name, "snapshot": snapshot,
             "promoted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    json.dumps(entry)  # fail before touching the files if the snapshot is not JSON
    _append(d, {"event": "promote", "entry": entry})
    _write_current(d, entry)
    return d / CURRENT


def current(registry_dir: str | Path) -> dict[str, Any] | None:
    """The promoted baseline in force ({run_id, name, snapshot, promoted_at}); None before any promotion."""
    path = Path(registry_dir) / CURRENT
    return json.loads(path.read_text()) if path.exists() else None


def rollback(registry_dir: str | Path) -> dict[str, Any]:
    """Make the previous promoted baseline current again and return its entry."""
    d = Path(registry_dir)
    stack = _stack(_read_history(d))
    if len(stack) < 2:
        raise ValueError(f"nothing to roll back to in {d}: {len(stack)} promotion(s) in force, a "
                         f"rollback needs a previous one")
    undone, previous = stack[-1], stack[-2]
    _append(d, {"event": "rollback", "undone_run_id": undone["run_id"],
                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    _write_current(d, previous)
    return previous
