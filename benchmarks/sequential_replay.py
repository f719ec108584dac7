"""What sequential stopping (ab.looks) would have decided on switchback A/Bs already run: read back the per-request
timings that benchmarks/error_rates.py keeps (raw/<kind>-s<seed>.json, or a .tgz of raw/), look at the latency
gates after each share of the blocks at gate.alpha / looks (optladder.abtest.verdict.interim_latency, the function
`ab.looks` calls during a replay), and count the decisions and the blocks each A/B would have played.

Exploratory, on A/Bs measured without looks: the same requests and blocks, so it shows the blocks saved and the
verdicts moved, not a measured error rate of the sequential design. The final look at looks=1 must give back each
A/B's committed verdict (checked; a mismatch is printed).

    python benchmarks/sequential_replay.py benchmarks/results/error_rates/gpu_h100_allon_raw.tgz \\
        --results benchmarks/results/error_rates/gpu_h100_allon.json --looks 1,2,3 -- \\
        '++gate.latency_max_regression={perf/e2e_ms_p99:null,perf/e2e_ms_p90:0.1}'
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def read_raw(path: Path) -> dict[str, dict]:
    """name (e.g. aa-s1) -> the compacted A/B."""
    out = {}
    if path.is_dir():
        for f in sorted(path.glob("*.json")):
            out[f.stem] = json.loads(f.read_text())
        return out
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile() and m.name.endswith(".json"):
                out[Path(m.name).stem] = json.load(io.TextIOWrapper(tar.extractfile(m)))
    return out


def arm_blocks(ab: dict, arm: str) -> list[list]:
    from optladder.traffic.request import RequestRecord

    fields = ab["fields"]
    a = ab["arms"][arm]
    by_id = {}
    for row in a["requests"]:
        r = dict(zip(fields, row))
        by_id[r["id"]] = RequestRecord(r["id"], r["scheduled_at"], r["input_tokens"], r["output_tokens"],
                                       sent_at=r["sent_at"], first_token_at=r["first_token_at"],
                                       finished_at=r["finished_at"], output_tokens=r["output_tokens"], ok=r["ok"])
    return [[by_id[i] for i in block] for block in a["blocks"]]


def sequential(ctrl: list[list], cand: list[list], gate, looks: int) -> tuple[str, int]:
    """(the verdict of the latency gates, the blocks played) with `looks` looks at alpha / looks."""
    from optladder.abtest.verdict import interim_latency
    from optladder.experiments.switchback import look_points

    g = replace(gate, alpha=gate.alpha / looks)
    for b in look_points(len(ctrl), looks):
        status, _ = interim_latency(ctrl[:b], cand[:b], g)
        if status is not None:
            return status, b
    status, results = interim_latency(ctrl, cand, g)
    if status is None:  # the end: undecided is inconclusive
        status = "inconclusive"
    return status, len(ctrl)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path, help="a raw/ folder or a .tgz holding one")
    ap.add_argument("--results", type=Path, help="the results.json whose verdicts the one-look case must match")
    ap.add_argument("--looks", default="1,2,3", help="comma-separated numbers of looks to compare")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]  # gate overrides, as the A/Bs ran
    from omegaconf import OmegaConf

    from optladder.abtest.gates import GateConfig
    from optladder.experiments.schema import register
    from hydra import compose, initialize_config_dir
    from optladder.paths import CONF_DIR

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=list(args.overrides))
    gate = GateConfig.from_dict(OmegaConf.to_container(cfg.gate, resolve=True))
    abs_ = read_raw(args.raw)
    committed = {}
    if args.results:
        committed = {f"{r['kind']}-s{r['seed']}": r["verdict"] for r in json.loads(args.results.read_text())["rows"]}
    looks = [int(x) for x in args.looks.split(",")]
    rows = []
    for name, ab in sorted(abs_.items()):
        ctrl, cand = arm_blocks(ab, "control"), arm_blocks(ab, "candidate")
        row = {"ab": name, "kind": name.rsplit("-s", 1)[0]}
        for k in looks:
            row[k] = sequential(ctrl, cand, gate, k)
        if name in committed and row.get(1, (None,))[0] != committed[name] and 1 in looks:
            print(f"mismatch: {name} committed {committed[name]}, recomputed {row[1][0]}", file=sys.stderr)
        rows.append(row)
    print(f"{len(rows)} A/Bs from {args.raw}; gates {gate.latency_max_regression} at alpha {gate.alpha}")
    print()
    print("| arms | looks | A/Bs | pass | fail | inconclusive | mean blocks played |")
    print("|---|---|---|---|---|---|---|")
    for kind in sorted({r["kind"] for r in rows}, key=lambda k: (k != "aa", k)):
        rs = [r for r in rows if r["kind"] == kind]
        label = "identical (A/A)" if kind == "aa" else f"candidate +{float(kind[4:]):.0%} a step"
        for k in looks:
            n = {s: sum(r[k][0] == s for r in rs) for s in ("pass", "fail", "inconclusive")}
            print(f"| {label} | {k} | {len(rs)} | {n['pass']} | {n['fail']} | {n['inconclusive']} | "
                  f"{statistics.mean(r[k][1] for r in rs):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
