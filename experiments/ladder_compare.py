"""Does a ladder reproduce? Two runs of the same ladder side by side: the same settings, the same verdict at every
rung, and each headline metric within run-to-run noise.

    python -m experiments.ladder_compare LADDER_A LADDER_B [--noise-sd 0.10] [--k 2]

LADDER_A / LADDER_B: a ladder's run directory (the one holding ladder.json and its rung directories) or its
ladder.json. A metric is within noise when |ln(B / A)| <= k * noise_sd: noise_sd is the SD of the log ratio of
two identical runs (gate.run_noise, measured by an A/A sweep: README, "A/A calibration"; 0.10 for E2E p99), k = 2
about 95% of identical pairs. Settings are the rungs' resolved configs (the first rung's, when both directories
hold their snapshots): a ladder run with other settings is not a reproduction, whatever its numbers. Machines and
code that differ are listed, not judged (a reproduction on another machine is the point). Each rung's "kept up"
(the trace's arrival span over its makespan) says whether the engine kept up with the trace: a rung below 0.95
ran at or past its capacity, where latency follows the path its queue took, and is marked where it is named.

Exit status: 0 reproduced, 1 not (each reason printed), 2 the input cannot be compared (missing files, other rungs).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from abtest.ladder import ROWS, _fmt
from experiments.diff import diff_dicts
from experiments.snapshot import SNAPSHOT_FILE

LADDER_FILE = "ladder.json"
# where files live, not what ran (the digests below say whether the data is the same)
NOT_SETTINGS = ("data.root", "tracking.uri", "hydra.")


class CompareError(ValueError):
    """The two ladders cannot be compared (say why)."""


def load_ladder(ref: str) -> tuple[dict, Path | None]:
    """(ladder.json's content, the run directory or None when given the file alone)."""
    path = Path(ref)
    file = path / LADDER_FILE if path.is_dir() else path
    if not file.is_file():
        raise CompareError(f"{ref}: no {LADDER_FILE} there (give a ladder's run directory or its {LADDER_FILE})")
    ladder = json.loads(file.read_text())
    if not isinstance(ladder, dict) or not isinstance(ladder.get("rungs"), list) or not ladder["rungs"]:
        raise CompareError(f"{file}: not a ladder's {LADDER_FILE} (no rungs)")
    return ladder, file.parent if path.is_dir() else None


def _snapshot(run_dir: Path | None, rung: dict) -> dict | None:
    """The rung's config snapshot: its first run directory (rung<i>-<opt>-r0), not a rerun of its control."""
    if run_dir is None:
        return None
    name = rung["opt"] or "baseline"
    snap = run_dir / f"rung{rung['rung']}-{name}-r0" / SNAPSHOT_FILE
    return json.loads(snap.read_text()) if snap.is_file() else None


def within(a: float | None, b: float | None, band: float) -> bool | None:
    """B within band (in log ratio) of A; None when it cannot be said (a value missing, or signs differ)."""
    if a is None or b is None:
        return None
    if a == b:
        return True
    if a <= 0 or b <= 0:
        return None
    return abs(math.log(b / a)) <= band


# A replay whose last answer came well after its last arrival served less than the trace offered: the engine ran at
# or past its capacity, where latency depends on the path the queue happened to take, not on the switch alone (or
# the replay is short against its answers: one long answer at the end does the same to a replay of seconds)
KEPT_UP = 0.95


def kept_up(metrics: dict) -> float | None:
    """The trace's arrival span over the replay's makespan: the out tok/s served over those offered (every request
    answered, so the tokens are the same); 1 when the engine kept up, lower when it finished after the trace by a
    queue. None without both figures (a closed-loop workload has no arrival span)."""
    span, makespan = metrics.get("traffic/duration_s"), metrics.get("perf/makespan_s")
    if not span or not makespan or span <= 0 or makespan <= 0:
        return None
    return span / makespan


def _ignored(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p if p.endswith(".") else p + ".") for p in prefixes)


def compare(a: tuple[dict, Path | None], b: tuple[dict, Path | None], noise_sd: float = 0.10,
            k: float = 2.0, ignore: tuple[str, ...] = ()) -> tuple[bool, list[str]]:
    """(reproduced, the report's lines). ignore: settings (keys or prefixes) whose difference does not count,
    e.g. a default that changed between the runs for a switch neither ran."""
    (la, da), (lb, db) = a, b
    ra, rb = la["rungs"], lb["rungs"]
    opts_a, opts_b = [r["opt"] for r in ra], [r["opt"] for r in rb]
    if opts_a != opts_b:
        raise CompareError(f"the ladders have other rungs: A {opts_a}, B {opts_b}")
    band = k * noise_sd
    reasons: list[str] = []
    out: list[str] = []

    sa, sb = _snapshot(da, ra[0]), _snapshot(db, rb[0])
    if sa is None or sb is None:
        out.append("settings: not compared (a rung directory's snapshot is missing: give both run directories)")
    else:
        every = diff_dicts(sa.get("resolved_config", {}), sb.get("resolved_config", {}))
        settings = [d for d in every if not _ignored(d[0], NOT_SETTINGS + tuple(ignore))]
        out.append(f"settings: {len(settings)} difference(s)" + (":" if settings else " (the same ladder)"))
        out += [f"  {key}: {va} -> {vb}" for key, va, vb in settings]
        skipped = [d for d in every if d not in settings]
        if skipped:
            out.append("  not counted: " + "; ".join(f"{key}: {va} -> {vb}" for key, va, vb in skipped))
        if settings:
            reasons.append(f"the settings differ ({', '.join(key for key, _, _ in settings[:6])}"
                           f"{', ...' if len(settings) > 6 else ''}): not the same ladder")
        for digest, what in (("requests_digest", "requests"), ("prompts_digest", "quality prompts")):
            if sa.get(digest) != sb.get(digest):
                out.append(f"  {digest}: {sa.get(digest)} -> {sb.get(digest)}")
                reasons.append(f"other {what} ({digest} differs)")
        env = [key for key, _, _ in diff_dicts(sa.get("environment", {}), sb.get("environment", {}))]
        out.append(f"environment (reported, not judged): {', '.join(env) if env else 'the same'}")
    out.append("")

    labels = [label for label, _ in ROWS]
    out.append("| rung | opt | verdict A | verdict B | kept up A / B | " + " | ".join(labels) + " |")
    out.append("|---|---|---|---|---|" + "---|" * len(labels))
    checked = missed = 0
    loaded: list[str] = []
    for x, y in zip(ra, rb):
        opt = x["opt"] or "baseline"
        ka, kb = kept_up(x.get("metrics", {})), kept_up(y.get("metrics", {}))
        load = " / ".join("-" if v is None else f"{v:.2f}" for v in (ka, kb))
        over = any(v is not None and v < KEPT_UP for v in (ka, kb))
        if over:
            loaded.append(f"rung {x['rung']} ({opt})")
        n_reasons = len(reasons)
        if x["status"] != y["status"]:
            reasons.append(f"rung {x['rung']} ({opt}): verdict {x['status']} in A, {y['status']} in B")
        cells = []
        for label, key in ROWS:
            va, vb = x.get("metrics", {}).get(key), y.get("metrics", {}).get(key)
            ok = within(va, vb, band)
            if va is None and vb is None:
                cells.append("-")
                continue
            if ok is None:
                cells.append(f"{_fmt(va)} -> {_fmt(vb)} (?)")
                continue
            checked += 1
            ratio = f"{vb / va:.2f}×" if va else "="
            cells.append(f"{ratio}" if ok else f"**{ratio}**")
            if not ok:
                missed += 1
                reasons.append(f"rung {x['rung']} ({opt}): {label} {_fmt(va)} -> {_fmt(vb)} ({vb / va:.2f}×), "
                               f"outside ±{band:.2f} in log ratio")
        if over:  # a moved figure or verdict of a rung past its capacity: say so where it is named
            reasons[n_reasons:] = [f"{r} [kept up {load}]" for r in reasons[n_reasons:]]
        same = "" if x["status"] == y["status"] else " **≠**"
        out.append(f"| {x['rung']} | {opt} | {x['status']} | {y['status']}{same} | {load} | "
                   + " | ".join(cells) + " |")
    verdicts = sum(x["status"] == y["status"] for x, y in zip(ra, rb))
    out += ["", f"verdicts: {verdicts}/{len(ra)} the same; metrics: {checked - missed}/{checked} within "
            f"{k:g} × {noise_sd:g} in log ratio (B / A shown; bold: outside)"]
    out.append("kept up: the trace's arrival span over the replay's makespan (out tok/s served over offered); "
               f"below {KEPT_UP:g} the replay ran on well past the last arrival (a queue, or answers long against "
               "a short trace)")
    reproduced = not reasons
    out.append("reproduced" if reproduced else "not reproduced:")
    out += [f"- {r}" for r in reasons]
    if loaded and not reproduced:
        out.append(f"{len(loaded)} rung(s) did not keep up with the trace in A or B ({', '.join(loaded)}): at or past "
                   "capacity (or a replay short against its answers), latency follows the path the queue took and moves between runs more than gate.run_noise "
                   "says; a ladder meant to reproduce needs a load every rung keeps up with (a larger "
                   "workload.time_scale, or fewer workload.num_requests from a trace whose rate rises)")
    return reproduced, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ladder_a", help="a ladder's run directory, or its ladder.json")
    p.add_argument("ladder_b")
    p.add_argument("--noise-sd", type=float, default=0.10,
                   help="SD of ln(B / A) between identical runs (gate.run_noise; default 0.10)")
    p.add_argument("--k", type=float, default=2.0, help="how many SDs a metric may move (default 2)")
    p.add_argument("--ignore", action="append", default=[], metavar="KEY",
                   help="a setting (or a prefix: engine.piecewise) whose difference does not count; repeatable")
    args = p.parse_args(argv)
    for name in ("noise_sd", "k"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            p.error(f"--{name.replace('_', '-')}={value}: must be a positive number")
    try:
        reproduced, lines = compare(load_ladder(args.ladder_a), load_ladder(args.ladder_b), args.noise_sd, args.k,
                                     tuple(args.ignore))
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"A: {args.ladder_a}\nB: {args.ladder_b}\n")
    print("\n".join(lines))
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
