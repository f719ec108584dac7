"""The best config of a knob sweep under an SLO, and the A/B that gates it against the sweep's defaults.

Every (config, load level) of the sweep is checked against the SLO's level bounds: TTFT p99 <= slo.ttft_p99_s
and TPOT p99 <= slo.tpot_p99_s (a bound set to null is left out), with failed requests counted as infinitely
slow, so a level where more than 1% of requests failed misses whatever its p99 of the rest. A config
*sustains* the levels it meets in order of load up to its first miss (a miss at a lower load is not redeemed by
a lucky pass at a higher one); its SLO point is the highest of them. The best config is the one with the most
output tok/s per GPU at its SLO point; ties go to the lower TTFT p99 there, then TPOT p99, then the earlier
job. Where no config meets the SLO at any level, the closest one is named: the (config, level) whose worst
p99 over its bound is the smallest.

The gate: the best config's swept overrides as the candidate of an A/B whose control is the sweep's base
command (the swept keys at their defaults), at the load level the best config sustains. It is written as an
ab config beside the sweep (gate/ab/knob_sweep_best.yaml) with the command that runs it; nothing runs it.
"""
from __future__ import annotations

import math
import shlex
from pathlib import Path

import yaml

from optladder.traffic.metrics import SLO

FAILED_SHARE_MAX = 0.01  # above it a p99 counting failures as infinitely slow is infinite
LOAD_FALLS_WITH = ("workload.time_scale",)  # knobs whose larger value is less load (a slower trace)
GATE_NAME = "knob_sweep_best"
BOUNDS = (("ttft_p99_s", "load/ttft_ms_p99", "TTFT p99"), ("tpot_p99_s", "load/tpot_ms_p99", "TPOT p99"))


def check_level(config: str, order: int, lv: dict, slo: SLO) -> dict:
    """One (config, level) against the SLO: its measures, whether it meets it, and why not."""
    m = lv.get("metrics", {})
    ok, failed = m.get("load/requests_ok", 0.0), m.get("load/requests_failed", 0.0)
    share = failed / (ok + failed) if ok + failed > 0 else 1.0
    row = {"config": config, "order": order, "knob": lv.get("knob"), "level": lv.get("value"),
           "per_gpu": m.get("load/out_tok_s_per_gpu", 0.0), "per_user": m.get("load/out_tok_s_per_user", 0.0),
           "throughput": m.get("load/throughput_out_tok_s", 0.0), "e2e_ms_p99": m.get("load/e2e_ms_p99"),
           "ttft_ms_p99": m.get("load/ttft_ms_p99"), "tpot_ms_p99": m.get("load/tpot_ms_p99"),
           "failed_share": share}
    misses, worst = [], 0.0
    if share > FAILED_SHARE_MAX:
        misses.append(f"{share:.0%} of requests failed")
        worst = math.inf
    for field, key, label in BOUNDS:
        bound = getattr(slo, field)
        if bound is None:
            continue
        got = m.get(key)
        if got is None:
            misses.append(f"{label} unmeasured")
            worst = math.inf
            continue
        ratio = got / (bound * 1000.0)
        worst = max(worst, ratio)
        if ratio > 1.0:
            misses.append(f"{label} {got:.0f} ms > {bound * 1000.0:g} ms")
    row.update(meets=not misses, misses=misses, worst_ratio=worst)
    return row


def load_key(row: dict) -> float:
    """Ascending in load: a larger rate or concurrency is more load, a larger trace time_scale less."""
    return -row["level"] if row["knob"] in LOAD_FALLS_WITH else row["level"]


def sustained(rows: list[dict]) -> tuple[dict | None, dict | None]:
    """A config's SLO point (its highest load level met with every lower one met too) and its first miss."""
    point = None
    for row in sorted(rows, key=load_key):
        if not row["meets"]:
            return point, row
        point = row
    return point, None


def _rank(row: dict) -> tuple:
    ttft = row["ttft_ms_p99"] if row["ttft_ms_p99"] is not None else math.inf
    tpot = row["tpot_ms_p99"] if row["tpot_ms_p99"] is not None else math.inf
    return (-row["per_gpu"], ttft, tpot, row["order"])


def slo_dict(slo: SLO) -> dict:
    return {"ttft_p99_ms": None if slo.ttft_p99_s is None else slo.ttft_p99_s * 1000.0,
            "tpot_p99_ms": None if slo.tpot_p99_s is None else slo.tpot_p99_s * 1000.0,
            "failed_share_max": FAILED_SHARE_MAX}


def slo_text(slo: SLO) -> str:
    parts = [f"{label} <= {getattr(slo, f) * 1000.0:g} ms" for f, _, label in BOUNDS if getattr(slo, f) is not None]
    return ", ".join(parts + [f"failed <= {FAILED_SHARE_MAX:.0%}"])


def best_under_slo(curves: dict[str, list[dict]], slo: SLO) -> dict:
    """curves: config name -> its levels (optladder/experiments/levels.py), in the sweep's order."""
    checked = {c: [check_level(c, i, lv, slo) for lv in levels] for i, (c, levels) in enumerate(curves.items())}
    configs = []
    for c, rows in checked.items():
        point, miss = sustained(rows)
        configs.append({"config": c, "slo_point": point, "first_miss": miss})
    meeting = sorted((x["slo_point"] for x in configs if x["slo_point"] is not None), key=_rank)
    out = {"slo": slo_dict(slo), "slo_text": slo_text(slo), "configs": configs,
           "levels": [r for rows in checked.values() for r in rows],
           "best": meeting[0] if meeting else None, "runner_up": meeting[1] if len(meeting) > 1 else None,
           "margin_tok_s": None, "margin_pct": None, "tied": False, "closest": None}
    best, second = out["best"], out["runner_up"]
    if best is not None and second is not None:
        out["margin_tok_s"] = best["per_gpu"] - second["per_gpu"]
        out["margin_pct"] = 100.0 * out["margin_tok_s"] / second["per_gpu"] if second["per_gpu"] > 0 else None
        out["tied"] = best["per_gpu"] == second["per_gpu"]
    if best is None and out["levels"]:
        out["closest"] = min(out["levels"], key=lambda r: (r["worst_ratio"], r["failed_share"], _rank(r)))
    out["summary"] = summary_line(out)
    return out


def _at(row: dict) -> str:
    return f"{row['knob']}={row['level']:g}"


def summary_line(pick: dict) -> str:
    best, second = pick["best"], pick["runner_up"]
    if best is None:
        c = pick["closest"]
        if c is None:
            return f"best under the SLO ({pick['slo_text']}): no load levels were measured"
        return (f"no config meets the SLO ({pick['slo_text']}) at any load level; the closest: {c['config']} at "
                f"{_at(c)} ({'; '.join(c['misses'])})")
    line = (f"best under the SLO ({pick['slo_text']}): {best['config']}, {best['per_gpu']:.4g} out tok/s per GPU "
            f"at {_at(best)}")
    if second is None:
        return line + "; the only config that meets it"
    if pick["tied"]:
        return line + f"; tied with {second['config']} at {_at(second)} (the tie goes to the lower TTFT p99, " \
                      "then TPOT p99, then the earlier job)"
    pct = f", {pick['margin_pct']:+.1f}%" if pick["margin_pct"] is not None else ""
    return line + (f"; runner-up {second['config']}, {second['per_gpu']:.4g} at {_at(second)} "
                   f"({pick['margin_tok_s']:+.4g} tok/s{pct})")


def markdown(pick: dict) -> str:
    """The section of pareto.md: the best config, and each config's SLO point."""
    lines = ["", f"## Best config under the SLO ({pick['slo_text']})", "", pick["summary"], "",
             "| config | highest load meeting the SLO | out tok/s per GPU there | TTFT p99 ms | TPOT p99 ms | first miss |",
             "|---|---|---|---|---|---|"]

    def ms(v):
        return "-" if v is None else f"{v:.0f}"

    for x in pick["configs"]:
        p, miss = x["slo_point"], x["first_miss"]
        why = f"{_at(miss)}: {'; '.join(miss['misses'])}" if miss else "none"
        if p is None:
            lines.append(f"| {x['config']} | none | - | - | - | {why} |")
        else:
            lines.append(f"| {x['config']} | {_at(p)} | {p['per_gpu']:.4g} | {ms(p['ttft_ms_p99'])} | "
                         f"{ms(p['tpot_ms_p99'])} | {why} |")
    return "\n".join(lines) + "\n"


# --- the gate ---------------------------------------------------------------------------------------------

def gate(best: dict | None, candidate: list[str], base: list[str], defaults: dict[str, str], out_dir: Path,
         is_defaults: bool) -> dict:
    """The A/B of the best config (its swept overrides, `candidate`) against the sweep's base command
    (`base`: the non-swept overrides; the swept keys then at `defaults`), written as an ab config under
    out_dir/gate and returned with the command that runs it."""
    defaults_text = ", ".join(f"{k}={v}" for k, v in defaults.items()) or "the base config"
    if best is None:
        return {"command": None, "why": "no config meets the SLO: nothing to gate", "defaults": defaults}
    if is_defaults or not candidate:
        return {"command": None, "defaults": defaults,
                "why": f"the best config is the sweep's defaults ({defaults_text}): nothing to gate"}
    keep = [o for o in base if not o.split("=", 1)[0].lstrip("+~").startswith(("replay.load_levels", best["knob"]))]
    at = f"{best['knob']}={_num(best['level'])}"
    conf_dir = Path(out_dir).resolve() / "gate"
    (conf_dir / "ab").mkdir(parents=True, exist_ok=True)
    path = conf_dir / "ab" / f"{GATE_NAME}.yaml"
    header = (f"# The knob sweep's best config under the SLO against its defaults ({defaults_text}), at the load it\n"
              f"# sustains ({at}). Written by the sweep (optladder/experiments/slo_pick.py); run it with:\n"
              "#   {command}\n")
    body = {"name": GATE_NAME, "control": [], "candidate": list(candidate), "repeats": 1}
    args = ["python", "run.py", *keep, at, f"hydra.searchpath=[file://{conf_dir}]", f"+ab={GATE_NAME}"]
    command = " ".join(shlex.quote(a) for a in args)
    path.write_text(header.replace("{command}", command) + yaml.safe_dump(body, sort_keys=False))
    return {"command": command, "ab_config": str(path), "control": [], "candidate": list(candidate),
            "load": at, "defaults": defaults, "why": None}


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def gate_markdown(g: dict) -> str:
    if g.get("command") is None:
        return f"\n## Gate\n\n{g['why']}\n"
    return ("\n## Gate against the defaults\n\nNot run by the sweep. The A/B of the best config (candidate: "
            f"`{' '.join(g['candidate'])}`) against the sweep's defaults (control: "
            f"{', '.join(f'`{k}={v}`' for k, v in g['defaults'].items()) or 'the base config'}) at {g['load']}; "
            f"exit 0 when the rollout gates pass ({g['ab_config']}):\n\n```\n{g['command']}\n```\n")
