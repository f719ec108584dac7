"""Decode-only steps of two engines at equal rows, from the step logs benchmarks/gpu_serving_vs_vllm.py writes:
the median time of a decode-only step in bins of decode rows, ours against vLLM's, and a least-squares line
(ms = a + b x rows) for each, which the few long steps pull (the medians are the comparison).

    python3 benchmarks/serving_steps_compare.py --ours OURS.json[.gz] --vllm VLLM.json[.gz] [--scale 4] [--bin 16]

Ours: serving_ours.json, each step's whole time (host work included). vLLM: serving_vllm.json, whose log holds when
each iteration was recorded (after its outputs were processed); a decode-only step's time there is the spacing of
its record from the one before, and only steps between two decode-only ones are kept (the spacing then holds no
prompt work). vLLM schedules asynchronously, so a spacing measures the engine's period, which is the step's time
while the GPU stays busy. Around a step with prompt work it is not always its own step's time: in the H200
replays of 2026-12-02 the record before one with prompt work often held a long spacing (medians over all
records with prompt work: 21.4 ms before against 6.7 ms for the record itself at 1x, where ~1,000 prompt tokens
of the 8B shape need ~18 ms at the chip's peak; 20.4 against 16.3 at 4x; about equal at 8x). Why is not
established (a likely cause: the host launching the step with prompt work before it waits for the step before).
So steps with prompt work are compared as pairs, each with the step before it (ours: their two durations; vLLM:
their two spacings), where both engines' neighbours are decode-only, binned by prompt tokens (--prompt-bin).
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def ours_steps(run: dict) -> list[tuple[int, float]]:
    """(decode rows, ms) of each decode-only step: [start, ms, prompt, decode] rows."""
    return [(x[3], x[1]) for x in run["step_log"] if x[2] == 0 and x[3] > 0]


def vllm_spacings(log: list[list]) -> list[float | None]:
    """Each iteration's time, the spacing of its record from the one before (None for the first): [recorded ms, the
    core's wait ms, prompt, decode] rows (the script's first version, in the results of 2026-12-02, wrote
    [recorded - wait, wait, prompt, decode, recorded])."""
    at = 4 if log and len(log[0]) == 5 else 0
    return [None] + [cur[at] - prev[at] for prev, cur in zip(log, log[1:])]


def vllm_steps(run: dict) -> list[tuple[int, float]]:
    """(decode rows, ms) of each decode-only iteration between two decode-only ones, timed by its record's spacing."""
    log = run["step_log"]
    times = vllm_spacings(log)
    return [(log[i][3], times[i]) for i in range(1, len(log) - 1)
            if log[i][2] == 0 and log[i][3] > 0 and log[i - 1][2] == 0 and log[i + 1][2] == 0]


def prompt_pairs(times: list[float | None], log: list[list]) -> list[tuple[int, float]]:
    """(prompt tokens, ms of the step and the one before it) for each step with prompt work whose two neighbours
    and the step before that carry none; times[i]: step i's time (ours: its duration; vLLM: its record's
    spacing, None for the first, never used: a pair starts at the third step)."""
    return [(log[i][2], times[i - 1] + times[i]) for i in range(2, len(log) - 1)
            if log[i][2] > 0 and log[i - 1][2] == 0 and log[i - 2][2] == 0 and log[i + 1][2] == 0]


def ours_prompt_pairs(run: dict) -> list[tuple[int, float]]:
    log = run["step_log"]
    return prompt_pairs([x[1] for x in log], log)


def vllm_prompt_pairs(run: dict) -> list[tuple[int, float]]:
    log = run["step_log"]
    return prompt_pairs(vllm_spacings(log), log)


def binned(ours: list[tuple[int, float]], theirs: list[tuple[int, float]], width: int, what: str,
           unit: str) -> list[str]:
    """Medians of both engines' times side by side in bins of `width` of `what` (each point: (what, ms)); empty
    bins left out."""
    top = max([p[0] for p in ours + theirs], default=0)
    out = [f"| {what} | optladder: {unit}, ms p50 | vLLM: {unit}, ms p50 | optladder / vLLM |", "|---|---|---|---|"]
    for lo in range(1, top + 1, width):
        hi = lo + width - 1
        a = [p[1] for p in ours if lo <= p[0] <= hi]
        b = [p[1] for p in theirs if lo <= p[0] <= hi]
        if not a and not b:
            continue
        ma = statistics.median(a) if a else None
        mb = statistics.median(b) if b else None
        out.append(f"| {lo}-{hi} | {len(a):,}, {'-' if ma is None else f'{ma:.2f}'} | "
                   f"{len(b):,}, {'-' if mb is None else f'{mb:.2f}'} | {f'{ma / mb:.2f}×' if ma and mb else '-'} |")
    return out


def pairs_table(ours: list[tuple[int, float]], theirs: list[tuple[int, float]], width: int = 512) -> list[str]:
    return binned(ours, theirs, width, "prompt tokens", "pairs")


def line(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    if len(points) < 2:
        return None
    mx = statistics.fmean(p[0] for p in points)
    my = statistics.fmean(p[1] for p in points)
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return None
    b = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    return my - b * mx, b


def table(ours: list[tuple[int, float]], theirs: list[tuple[int, float]], width: int = 16) -> list[str]:
    out = binned(ours, theirs, width, "decode rows", "steps")
    fits = [(name, line(pts), len(pts)) for name, pts in (("optladder", ours), ("vLLM", theirs))]
    if any(f for _, f, _ in fits):
        out.append("")
    out += [f"{name}: a decode-only step {f[0]:.2f} ms + {f[1]:.4f} ms a row (least squares over {n:,} steps: the "
            f"few long ones pull it, the medians above do not)" for name, f, n in fits if f]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", type=Path, required=True)
    ap.add_argument("--vllm", type=Path, required=True)
    ap.add_argument("--scale", default="4")
    ap.add_argument("--repeat", type=int, default=0, help="which repeat of each (0: the first)")
    ap.add_argument("--bin", type=int, default=16)
    ap.add_argument("--prompt-bin", type=int, default=512, help="prompt tokens a bin of the pairs' table")
    args = ap.parse_args(argv)
    runs = []
    for path in (args.ours, args.vllm):
        res = load(path)
        reps = res.get("replay", {}).get(str(args.scale))
        if not reps or len(reps) <= args.repeat or "step_log" not in reps[args.repeat]:
            print(f"{path}: no step log of repeat {args.repeat} at time scale {args.scale} "
                  f"(scales there: {', '.join(res.get('replay', {})) or 'none'})", file=sys.stderr)
            return 2
        runs.append(reps[args.repeat])
    print("\n".join(["Decode-only steps at equal rows:", "", *table(ours_steps(runs[0]), vllm_steps(runs[1]), args.bin),
                     "", "A step with prompt work and the decode-only step before it:", "",
                     *pairs_table(ours_prompt_pairs(runs[0]), vllm_prompt_pairs(runs[1]), args.prompt_bin)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
