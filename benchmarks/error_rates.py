"""The latency gate's error rates, measured: how often identical arms fail (A/A), and how often a candidate made
slower by a known amount is caught (a test-only delay after each engine step, faults.step_slowdown: 0.1 adds
10% to every step's time).

Each A/B is the one `python run.py +ab=aa [ab.candidate=[faults.step_slowdown=X]] seed=S ...` runs (optladder's own
run_ab, called in this process one A/B after the other, so the engines' imports and CUDA start once), seeds 1..N
(each seed its own workload draw), the kinds interleaved (aa, +10%, +20%, aa, ...) so that whatever drifts over the
session hits every kind alike. After every A/B, results.json and table.md are written again: a run cut by a time
limit keeps what it measured.

    python benchmarks/error_rates.py --out /tmp/er --aa 20 --slowdowns 0.1,0.2 --runs 10 -- \\
        model=tiny engine.cpu_threads=1 ab.design=switchback
    python benchmarks/error_rates.py --deadline-s 540 ... -- model=smollm2_135m engine.device=cuda ...
    python benchmarks/error_rates.py --table benchmarks/results/error_rates/gpu_h100_smollm2.json   # a table again

The latency gate read is the first of gate.latency_max_regression (perf/e2e_ms_p99 by default). A/A: pass is
right, fail is a false fail. Slowdown: fail is a detection. Prints and writes a markdown table: per kind the
counts of pass / fail / inconclusive, the median interval half-width and the median MDE (80% power).
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without an install


def plan(aa: int, slowdowns: list[float], runs: int) -> list[tuple[str, float, int]]:
    """(kind, slowdown, seed) in interleaved order: the i-th of every kind before the (i+1)-th of any."""
    kinds = [("aa", 0.0, aa)] + [(f"slow{s:g}", s, runs) for s in slowdowns]
    out = []
    for i in range(max(k[2] for k in kinds)):
        for name, s, n in kinds:
            if i < n:
                out.append((name, s, i + 1))
    return out


def latency_gate(verdict: dict) -> dict:
    return next(g for g in verdict["gates"] if g["gate"] == "latency_max_regression")


RAW_FIELDS = ("id", "scheduled_at", "sent_at", "first_token_at", "finished_at", "input_tokens", "output_tokens", "ok")


def compact(run_dir: Path) -> dict | None:
    """A switchback A/B's raw timings without the token times: per arm its blocks (request ids) and one row per
    request (RAW_FIELDS), and the replay order (switchback.json); None for an A/B of whole runs."""
    order = run_dir / "switchback.json"
    if not order.exists():
        return None
    out = {"fields": RAW_FIELDS, "order": json.loads(order.read_text()), "arms": {}}
    for arm in ("control", "candidate"):
        d = next(run_dir.glob(f"{arm}-r*"), None)
        if d is None or not (d / "requests.jsonl").exists():
            continue
        rows = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines() if line.strip()]
        out["arms"][arm] = {"blocks": json.loads((d / "blocks.json").read_text()) if (d / "blocks.json").exists()
                            else None, "requests": [[r.get(f) for f in RAW_FIELDS] for r in rows]}
    return out


def table(rows: list[dict], head: str) -> str:
    lines = [head, "", "| arms | A/Bs | pass | fail | inconclusive | right | median change | median half-width | "
             "median MDE |", "|---|---|---|---|---|---|---|---|---|"]
    kinds = sorted({r["kind"] for r in rows}, key=lambda k: (k != "aa", k))
    for kind in kinds:
        rs = [r for r in rows if r["kind"] == kind]
        n = {s: sum(r["status"] == s for r in rs) for s in ("pass", "fail", "inconclusive")}
        right = n["pass"] if kind == "aa" else n["fail"]
        half = [(r["high"] - r["low"]) / 2 for r in rs if r["high"] is not None]
        mde = [r["mde"] for r in rs if r["mde"] is not None]
        change = [r["change"] for r in rs if r["change"] is not None]
        label = "identical (A/A)" if kind == "aa" else f"candidate +{float(kind[4:]):.0%} a step"

        def med(xs):
            return f"{statistics.median(xs):+.1%}" if xs else "-"
        lines.append(f"| {label} | {len(rs)} | {n['pass']} | {n['fail']} | {n['inconclusive']} | {right}/{len(rs)} | "
                     f"{med(change)} | {med(half).lstrip('+') if half else '-'} | "
                     f"{med(mde).lstrip('+') if mde else '-'} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("error_rates"))
    ap.add_argument("--aa", type=int, default=20)
    ap.add_argument("--slowdowns", default="0.1,0.2")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--deadline-s", type=float, default=None, help="start no A/B after this many seconds")
    ap.add_argument("--resume", action="store_true",
                    help="keep the A/Bs of --out's results.json (same overrides) and run only the others")
    ap.add_argument("--keep-runs", action="store_true", help="keep each A/B's run directories (default: verdicts)")
    ap.add_argument("--table", type=Path, default=None, metavar="RESULTS_JSON",
                    help="print the table of a results.json written earlier, and run nothing")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.table is not None:
        r = json.loads(args.table.read_text())
        print(table(r["rows"], r["head"]))
        return 0
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from optladder.experiments.ab_run import run_ab
    from optladder.experiments.schema import register
    from optladder.paths import CONF_DIR

    register()
    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    slowdowns = [float(x) for x in args.slowdowns.split(",") if x]
    rows: list[dict] = []
    done: set[tuple[str, int]] = set()
    if args.resume and (args.out / "results.json").exists():
        old = json.loads((args.out / "results.json").read_text())
        if old["overrides"] != args.overrides:
            raise SystemExit(f"--resume: {args.out / 'results.json'} was measured with other overrides "
                             f"({' '.join(old['overrides'])}); give another --out")
        rows = [r for r in old["rows"] if r["status"] != "error"]
        done = {(r["kind"], r["seed"]) for r in rows}
        print(f"resumed: {len(rows)} A/Bs from {args.out / 'results.json'}", flush=True)
    import torch

    head = (f"latency gate error rates; overrides: {' '.join(args.overrides)}; torch {torch.__version__}, "
            f"{platform.processor() or platform.machine()}"
            f"{', ' + torch.cuda.get_device_name() if torch.cuda.is_available() else ''}")
    for kind, slow, seed in plan(args.aa, slowdowns, args.runs):
        if (kind, seed) in done:
            continue
        if args.deadline_s is not None and time.monotonic() - t_start > args.deadline_s:
            print(f"deadline: {args.deadline_s:.0f} s passed, {len(rows)} A/Bs done", flush=True)
            break
        run_dir = args.out / "runs" / f"{kind}-s{seed}"
        ab = ["+ab=aa", f"seed={seed}", f"ab.registry_dir={args.out / 'registry'}", "tracking.enabled=false",
              "replay.progress=false"]
        if slow:
            ab.append(f"ab.candidate=['faults.step_slowdown={slow}']")
        overrides = [*args.overrides, *ab]
        GlobalHydra.instance().clear()
        t0 = time.monotonic()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
            try:
                code = run_ab(cfg, run_dir, overrides, {})
            except Exception as e:  # noqa: BLE001 - one A/B that raises is counted as such, the rest go on
                print(f"{kind} seed {seed}: raised {type(e).__name__}: {str(e)[:300]}", flush=True)
                rows.append({"kind": kind, "seed": seed, "status": "error", "error": str(e)[:300],
                             "change": None, "low": None, "high": None, "mde": None})
                continue
        v = json.loads((run_dir / "verdict.json").read_text())
        g = latency_gate(v)
        iv = g.get("interval") or {}
        row = {"kind": kind, "slowdown": slow, "seed": seed, "status": g["status"], "verdict": v["status"],
               "exit_code": code, "metric": g["metric"], "change": iv.get("estimate"), "low": iv.get("low"),
               "high": iv.get("high"), "mde": g.get("mde"), "seconds": round(time.monotonic() - t0, 1),
               "reason": g["reason"]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "reason"}), flush=True)
        raw = compact(run_dir)
        if raw is not None:  # per request and block, both arms: enough to recompute any statistic later
            (args.out / "raw").mkdir(exist_ok=True)
            (args.out / "raw" / f"{kind}-s{seed}.json").write_text(json.dumps(raw, separators=(",", ":")))
        if not args.keep_runs:
            keep = run_dir / "verdict.json"
            (args.out / "verdicts").mkdir(exist_ok=True)
            shutil.copy(keep, args.out / "verdicts" / f"{kind}-s{seed}.json")
            shutil.rmtree(run_dir, ignore_errors=True)
        (args.out / "results.json").write_text(json.dumps({"head": head, "overrides": args.overrides,
                                                           "rows": rows}, indent=1))
        (args.out / "table.md").write_text(table(rows, head) + "\n")
    print(table(rows, head))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
