"""The README's headline figures, regenerated from the committed results they quote (issue 44, item 5).

Each covered row of the headline table ("What it measured") has its result cell rendered here from the files
under benchmarks/results/ and compared with the README's cell as a whole: a re-run that changes a committed
result but not the README fails, and so does a README edit that no result backs. The first sweep's job counts
are taken from the registry the sweep reads (optladder/engine/opts.py), as the sweep itself takes them.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def readme_cell(study: str, hardware: str | None = None, model: str | None = None) -> str:
    """The results cell (4th column) of the headline row that links the study's page (of the rows that link it,
    the one on that hardware and model, where two do)."""
    link = f"](benchmarks/results/{study}/README.md) |"
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("|") and line.endswith(link)]
    rows = [r for r in rows if (hardware is None or r[0] == hardware) and (model is None or r[1].startswith(model))]
    assert len(rows) == 1, f"README.md: {len(rows)} headline rows link {study} ({hardware}, {model})"
    return rows[0][3]


def md_table(path: Path) -> dict[str, dict[str, str]]:
    """The first markdown table of a file: first column -> {header: cell}."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return {cells[0]: dict(zip(head, cells)) for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}


def load(rel: str) -> dict:
    return json.loads((RESULTS / rel).read_text(encoding="utf-8"))


def value(cell: str) -> str:
    """'49.4 (1.89×)' -> '49.4'."""
    return cell.split(" (")[0]


def ratio(cell: str) -> float:
    """'275.3 (4.01×)' -> 4.01."""
    return float(re.search(r"\(([\d.]+)×\)", cell).group(1))


def cpu_switches() -> str:
    t = md_table(RESULTS / "cpu_switches.md")
    on, base = t["all on"], t["baseline"]
    same = re.search(r"replay (\d+)/(\d+)", on["same tokens as baseline"]).groups()
    return (f"all lossless CPU switches on: {value(on['out tok/s'])} out tok/s vs {base['out tok/s']} "
            f"({ratio(on['out tok/s']):.2f}×), TTFT p50 {value(on['TTFT p50 ms'])} vs {base['TTFT p50 ms']} ms; "
            f"TPOT p50 {ratio(on['TPOT p50 ms']):.1f}× the baseline's; same text on {same[0]}/{same[1]}")


def gpu_h200() -> str:
    d = load("gpu_h200.json")
    pre = {p["attention"]: p["ms"] for p in d["prefill"] if p["tokens"] == 4096}
    naive, flash = pre["naive"], pre["sdpa_flash+sdpa"]
    dec = {r["variant"]: r for r in d["decode"] if r["batch"] == 1}
    fast, eager = dec["paged, graphs + fused + skinny GEMM (engine)"], dec["paged, eager"]
    return (f"flash_attn prefill {flash:.1f} vs {naive:.1f} ms ({naive / flash:.2f}×); decode step with CUDA "
            f"graphs + fused kernels {fast['gpu_ms']:.2f} vs {eager['gpu_ms']:.1f} ms eager, "
            f"{fast['gpu_over_floor']:.2f}× the weight-read floor")


def gpu_ab_vllm() -> str:
    c, v = (load(f"gpu_ab_vllm_h200/{arm}-r0/summary.json")["metrics"] for arm in ("control", "candidate"))
    assert load("gpu_ab_vllm_h200/verdict.json")["ab"] == "engine_vllm"
    return (f"`+ab=engine_vllm`, reference engine vs `vllm serve`: TPOT p50 {c['perf/tpot_ms_p50']:.1f} vs "
            f"{v['perf/tpot_ms_p50']:.1f} ms, E2E p99 {c['perf/e2e_ms_p99'] / 1000:.2f} vs "
            f"{v['perf/e2e_ms_p99'] / 1000:.2f} s")


def aa_cpu() -> str:
    s = load("aa_cpu/ab_summary.json")["summary"]
    latency = next(g for g in s["gates"] if g["gate"] == "latency_max_regression:perf/e2e_ms_p99")
    n = sum(s["verdicts"].values())
    return (f"{n} A/As (identical arms): {s['verdicts'].get('fail', 0)} failed, "
            f"{latency['statuses'].get('inconclusive', 0)} inconclusive on latency; run-to-run SD of log E2E p99 "
            f"{latency['noise'][0]:.3f}")


def gpu_quant() -> str:
    step = {r["variant"]: r["step_ms"] for r in load("gpu_quant_h200.json")["after"]["decode_llama3_8b_shape"]
            if r.get("batch") == 1}
    fp8, bf16 = step["quant_fp8"], step["bf16"]
    missed = "the 0.6× goal missed" if fp8 / bf16 > 0.6 else "the 0.6× goal met"
    return (f"quant_fp8 {fp8:.2f} ms vs bf16 {bf16:.2f} ({fp8 / bf16:.2f}×; {missed}); quant_int8 "
            f"{step['quant_int8']:.2f} ms")


def speculative() -> str:
    d = load("gpu_spec_h200.json")
    arms = d["smollm2"]["sets"]["repeat-heavy set (rewrite / fix / reformat)"]
    base, ngram = arms["baseline (no speculation)"], arms["ngram (k=4)"]
    speed = base["decode_ms_per_token"] / ngram["decode_ms_per_token"]
    return (f"speculative, n-gram drafts: {speed:.2f}× decode speed, {ngram['exact_vs_baseline']}/"
            f"{d['args']['prompts']} outputs equal; no gain under load")


def gpu_serving_vs_vllm() -> str:
    """The one-sitting run of 2026-12-02 (both engines on one warm machine), as its study page quotes it."""
    sitting = RESULTS / "gpu_serving_vs_vllm_h200_sitting_20261202"
    o, v = (json.loads(gzip.open(sitting / f"serving_{e}.json.gz").read()) for e in ("ours", "vllm"))

    def tok_s(d: dict, scale: str) -> float:  # the median over repeats, as the script's ratios take it
        return statistics.median(r["out_tok_s"] for r in d["replay"][scale])
    return (f"vs {v['engine']}: {o['decode_b1']['ms_per_token']:.2f} vs {v['decode_b1']['ms_per_token']:.2f} ms "
            f"per token; {tok_s(o, '1'):,.0f} vs {tok_s(v, '1'):,.0f} out tok/s at the trace's rate, "
            f"{tok_s(o, '8') / tok_s(v, '8'):.2f}× at 8× its rate")


def ladder_ends(run: str) -> tuple[dict, dict, int]:
    """The baseline's and the last rung's metrics of a ladder run, and how many switches the last rung has on."""
    rungs = load(f"gpu_ladder_h200/{run}/ladder.json")["rungs"]
    return rungs[0]["metrics"], rungs[-1]["metrics"], len(rungs[-1]["opts"])


NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}


def gpu_ladder_8b() -> str:
    base, top, n = ladder_ends("ts4_500")
    return (f"GPU ladder, baseline → {NUMBERS[n]} rungs on: E2E p99 {base['perf/e2e_ms_p99'] / 1000:.1f} → "
            f"{top['perf/e2e_ms_p99'] / 1000:.1f} s, TPOT p50 {base['perf/tpot_ms_p50']:.1f} → "
            f"{top['perf/tpot_ms_p50']:.1f} ms")


def gpu_ladder_smollm2() -> str:
    base, top, _ = ladder_ends("smollm2_ts2_200")
    cap0, cap1 = (load(f"gpu_ladder_h200/smollm2_capacity_64/{r}/capacity.json")
                  for r in ("rung0-baseline-r0", "rung6-cuda_graphs-r0"))
    assert cap0["slo_e2e_s"] == cap1["slo_e2e_s"] and cap0["mode"] == cap1["mode"] == "concurrency"

    def cap(c: dict) -> str:  # at the top of the range probed: a lower bound
        return f"≥ {c['value']:.0f}" if c["at_hi"] else f"{c['value']:.0f}"
    return (f"GPU ladder: E2E p99 {base['perf/e2e_ms_p99'] / 1000:.1f} → {top['perf/e2e_ms_p99'] / 1000:.2f} s, "
            f"TPOT p50 {base['perf/tpot_ms_p50']:.1f} → {top['perf/tpot_ms_p50']:.1f} ms; BLEU vs references "
            f"{base['quality/bleu_vs_ref']:.2f} → {top['quality/bleu_vs_ref']:.2f}; capacity at P99 ≤ "
            f"{cap0['slo_e2e_s']:g} s {cap(cap0)} → {cap(cap1)} (a separate, smaller run)")


PLANTS = {"kv_block_off_by_one": "a KV block read off by one", "stale_kv_slot": "a stale KV slot",
          "rope_off_by_one_chunk": "a rotary off-by-one in later prompt chunks"}


def near_tie_cases(*files: str) -> tuple[list[dict], list[dict]]:
    """(the real switches, the planted bugs) of the calibration files, in file order."""
    cases = [c for f in files for c in load(f"near_tie_calibration/{f}")]
    real = [c for c in cases if not c["case"].startswith("plant:")]
    assert all(c["expect"] == "pass" for c in real) and all(c["expect"] == "fail" for c in cases if c not in real)
    return real, [c for c in cases if c not in real]


def widest_fork(real: list[dict]) -> float:
    return max(c["worst_margin"] for c in real)


def near_tie_cpu() -> str:
    real, bugs = near_tie_cases("smollm2_bf16.json", "smollm2_bf16_chunked.json")
    assert all(c["verdict"] == "pass" for c in real)
    fa = next(c for c in real if c["case"] == "flash_attn")
    caught = [PLANTS[c["case"].split(":")[1]] for c in bugs if c["verdict"] == "fail"]
    missed = [PLANTS[c["case"].split(":")[1]] for c in bugs if c["verdict"] == "pass"]
    return (f"near-tie check: {', '.join(c['case'] for c in real)} pass (flash_attn changes {fa['diverged']} of "
            f"{fa['prompts']} answers; every fork within {widest_fork(real):.2f} nats); {' and '.join(caught)} fail; "
            f"{' and '.join(missed)} is missed in bf16")


def near_tie_h100() -> str:
    from optladder.engine.opts import OPTS

    real, bugs = near_tie_cases("smollm2_bf16_h100.json", "smollm2_bf16_chunked_h100.json")
    passed = [c for c in real if c["verdict"] == "pass"]
    gpu_only = [c["case"] for c in passed if OPTS[c["case"]].cuda_only]
    fa = next(c for c in real if c["case"] == "flash_attn")
    every = "all " if len(passed) == len(real) else f"{len(passed)} of "
    return (f"near-tie check: {every}{len(real)} lossless switches pass ({', '.join(gpu_only)} too; flash_attn "
            f"changes {fa['diverged']} of {fa['prompts']} answers; every fork within {widest_fork(real):.2f} nats); "
            f"{'all' if all(c['verdict'] == 'fail' for c in bugs) else 'not all'} {len(bugs)} planted bugs fail")


def error_rate_table(name: str) -> tuple[dict, dict, dict, dict]:
    """The rows of error_rates/<name> and its table as `python benchmarks/error_rates.py --table` prints it."""
    spec = importlib.util.spec_from_file_location("error_rates", ROOT / "benchmarks" / "error_rates.py")
    er = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(er)
    d = load(f"error_rates/{name}")
    lines = [line for line in er.table(d["rows"], d["head"]).splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    t = {cells[0]: dict(zip(head, cells)) for cells in
         ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}
    return d, t["identical (A/A)"], t["candidate +10% a step"], t["candidate +20% a step"]


def error_rates_allon() -> str:
    d, aa, s10, s20 = error_rate_table("gpu_h100_allon.json")
    return (f"switchback A/Bs on E2E p90 ({len(d['rows'])} of 40 so far): A/A {aa['fail']} of {aa['A/Bs']} failed, "
            f"{aa['pass']} passed, median interval ±{aa['median half-width']}; +10% a step failed {s10['fail']} "
            f"of {s10['A/Bs']}; +20% failed {s20['fail']} of {s20['A/Bs']}")


def error_rates() -> str:
    """From the table `python benchmarks/error_rates.py --table gpu_h100_smollm2.json` prints."""
    d, aa, s10, s20 = error_rate_table("gpu_h100_smollm2.json")
    partial = int(aa["A/Bs"]) < 20 or int(s10["A/Bs"]) < 10 or int(s20["A/Bs"]) < 10  # the issue's counts
    return (f"switchback A/Bs ({'partial: ' if partial else ''}{len(d['rows'])}): A/A median interval "
            f"±{aa['median half-width']}, {aa['fail']} of {aa['A/Bs']} failed; +20% a step failed {s20['fail']} of "
            f"{s20['A/Bs']}; +10% inconclusive {s10['inconclusive']} of {s10['A/Bs']}")


def lossy_cpu() -> str:
    """int8 from its verdict.json; the 3-bit damaged model from the study page's table (no raw file of that run
    is committed: the page's table is its only record)."""
    v = load("ab_quant_int8_cpu/verdict.json")
    tf = {g["metric"]: g for g in v["gates"] if g["gate"] == "teacher_forced"}
    rows = {"quality/kl_vs_control_mean": "KL mean", "quality/kl_vs_control_p99": "KL p99",
            "quality/top1_agree_vs_control": "top-1 agreement", "quality/ppl_ref_rel_change": "reference perplexity"}
    assert set(tf) == set(rows)
    page = [line for line in (RESULTS / "lossy_cpu" / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| ")]
    damaged = [next(line for line in page if line.startswith(f"| {label}")).rstrip(" |").endswith("fail")
               for label in rows.values()]
    return (f"`+ab=quant_int8` {'passes' if v['status'] == 'pass' else v['status']} (KL mean "
            f"{tf['quality/kl_vs_control_mean']['candidate']:.5f}, top-1 "
            f"{tf['quality/top1_agree_vs_control']['candidate']:.2%}); a 3-bit damaged model fails "
            f"{'every' if all(damaged) else f'{sum(damaged)} of {len(damaged)}'} teacher-forced gate"
            f"{'' if all(damaged) else 's'}")


def gpu_serving_path() -> str:
    """From r0.json: TPOT p50 of each server over the in-process replay's, at each scale (the median over rounds)."""
    res = load("gpu_serving_path_h100/r0.json")["results"]
    rounds = {len(runs) for by_mode in res.values() for runs in by_mode.values()}
    assert len(rounds) == 1, f"modes with different round counts: {rounds}"
    n = rounds.pop()

    def x(scale: str, mode: str) -> str:
        by_mode = next(v for k, v in res.items() if k.endswith(f" at {scale}x"))
        ratios = [h["perf/tpot_ms_p50"] / p["perf/tpot_ms_p50"] for h, p in zip(by_mode[mode], by_mode["in-process"])]
        return f"{statistics.median(ratios):.2f}x"

    return (f"the serving path on one engine: stdlib server TPOT p50 {x('1', 'stdlib')} in process at 1x, "
            f"{x('4', 'stdlib')} at 4x; ASGI {x('1', 'asgi')}, {x('4', 'asgi')} "
            f"({'one round' if n == 1 else f'{n} rounds'})")


def gpu_vllm_ladder() -> str:
    """From ladder.json: how many rungs ran, and each one's verdict and E2E p90 change against its control beside it."""
    d = load("gpu_vllm_ladder_h100/ladder.json")
    assert d["ladder"] == "vllm"
    parts = []
    for r in d["rungs"][1:]:
        g = next(g for g in r["verdict"]["gates"] if g["gate"] == "latency_max_regression")
        change = float(re.search(r"change ([+-][\d.]+)%", g["reason"]).group(1))
        near = next(g for g in r["verdict"]["gates"] if g["gate"] == "near_tie")["status"]
        parts.append(f"{r['opt']} {r['status']} (E2E p90 {change:+.1f}%, near-tie {near})")
    return (f"vLLM ladder, {len(d['rungs']) - 1} of {len(d['planned'])} rungs so far: " + "; ".join(parts))


# id: (the study the row links, its hardware and model where the study has two rows, the cell rebuilt)
ROWS = {"cpu_switches": ("cpu_switches", None, None, cpu_switches), "gpu_h200": ("gpu_h200", None, None, gpu_h200),
        "gpu_ab_vllm_h200": ("gpu_ab_vllm_h200", None, None, gpu_ab_vllm), "aa_cpu": ("aa_cpu", None, None, aa_cpu),
        "gpu_quant_h200": ("gpu_quant_h200", None, None, gpu_quant),
        "speculative": ("speculative", None, None, speculative),
        "gpu_serving_vs_vllm_h200": ("gpu_serving_vs_vllm_h200", None, None, gpu_serving_vs_vllm),
        "gpu_ladder_h200:8b": ("gpu_ladder_h200", "H200", "Llama-3-8B", gpu_ladder_8b),
        "gpu_ladder_h200:smollm2": ("gpu_ladder_h200", "H200", "SmolLM2", gpu_ladder_smollm2),
        "near_tie_calibration:cpu": ("near_tie_calibration", "2-core EPYC CPU", None, near_tie_cpu),
        "near_tie_calibration:h100": ("near_tie_calibration", "H100", None, near_tie_h100),
        "error_rates": ("error_rates", "H100", "SmolLM2-135M, bf16, eager", error_rates),
        "error_rates:allon": ("error_rates", "H100", "SmolLM2-135M, bf16, all switches on", error_rates_allon), "lossy_cpu": ("lossy_cpu", None, None, lossy_cpu),
        "gpu_serving_path_h100": ("gpu_serving_path_h100", None, None, gpu_serving_path),
        "gpu_vllm_ladder_h100": ("gpu_vllm_ladder_h100", None, None, gpu_vllm_ladder)}


def test_every_headline_row_is_checked():
    links = re.findall(r"\]\(benchmarks/results/([\w-]+)/README\.md\) \|$",
                       (ROOT / "README.md").read_text(encoding="utf-8"), re.M)
    assert sorted(links) == sorted(study for study, *_ in ROWS.values())


@pytest.mark.parametrize("row", sorted(ROWS))
def test_the_readme_headline_row_is_what_the_committed_result_says(row):
    study, hardware, model, cell = ROWS[row]
    assert readme_cell(study, hardware, model) == cell()


def test_a_changed_result_fails_the_check(tmp_path, monkeypatch):
    """The check reads the files: a result re-run to another figure no longer matches the README."""
    import tests.test_docs_figures as me

    (tmp_path / "aa_cpu").mkdir()
    s = load("aa_cpu/ab_summary.json")
    s["summary"]["verdicts"] = {"inconclusive": 17, "pass": 2, "fail": 1}
    (tmp_path / "aa_cpu" / "ab_summary.json").write_text(json.dumps(s))
    monkeypatch.setattr(me, "RESULTS", tmp_path)
    assert me.aa_cpu().startswith("20 A/As (identical arms): 1 failed")
    assert readme_cell("aa_cpu") != me.aa_cpu()


def cpu_sweep_counts() -> tuple[int, int, int]:
    """(jobs, run, skipped) of `'+opt=glob(*)'` on a CPU: one job an opt config, skipped when it, or an opt it
    needs, is CUDA only (the sweep's own rule, optladder/engine/opts.py)."""
    from optladder.engine.opts import OPTS
    from optladder.paths import conf_options

    def cuda(name: str) -> bool:
        spec = OPTS[name]
        return spec.cuda_only or any(cuda(n) for n in spec.needs)

    jobs = conf_options("opt")
    skipped = sum(cuda(name) for name in jobs)
    return len(jobs), len(jobs) - skipped, skipped


def test_the_first_sweep_page_gives_todays_job_counts():
    text = (RESULTS / "first_sweep_cpu" / "README.md").read_text(encoding="utf-8")
    jobs, ran, skipped = cpu_sweep_counts()
    assert (f"the same sweep has {jobs} jobs, of which a CPU runs {ran} and skips {skipped} (CUDA only)"
            in " ".join(text.split()))


# The figures docs/*.md quote from runs: each line rebuilt from the committed result and looked for in the page
# (whitespace as one space). A figure that no committed file backs was taken out of the docs, not checked here.

def doc(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text(encoding="utf-8").split())


def rung(run: str, name: str) -> dict:
    return next(r for r in load(f"gpu_ladder_h200/{run}/ladder.json")["rungs"] if r["opt"] == name)


def gates_flash_attn_answers() -> str:
    real = rung("smollm2_ts2_200", "flash_attn")["metrics"]["quality/exact_match_vs_control"]
    rand = rung("ts4_500", "flash_attn")["metrics"]["quality/exact_match_vs_control"]
    n = rung("smollm2_ts2_200", "flash_attn")["metrics"]["quality/num_prompts"]
    return (f"(flash_attn on SmolLM2: {real * n:.0f} of {n:.0f} answers equal on the H200 ladder; {rand * n:.0f} of "
            f"{n:.0f} with random bf16 weights:")


def gates_near_tie() -> str:
    cpu, _ = near_tie_cases("smollm2_bf16.json", "smollm2_bf16_chunked.json")
    gpu, gpu_bugs = near_tie_cases("smollm2_bf16_h100.json", "smollm2_bf16_chunked_h100.json")
    rope = next(c for c in gpu_bugs if "rope_off_by_one_chunk" in c["case"])
    assert rope["verdict"] == "fail" and len(rope["not_near_ties"]) == 1
    return (f"on the CPU (forks within {widest_fork(cpu):.2f} nats) and on an H100 (cuda_graphs and fused_kernels "
            f"too; forks within {widest_fork(gpu):.2f} nats); [...] caught on the H100 by one fork in "
            f"{rope['diverged']},")


def gates_error_rates() -> str:
    aa = [r for r in load("error_rates/gpu_h100_smollm2.json")["rows"] if r["kind"] == "aa"]
    half = [(r["high"] - r["low"]) / 2 for r in aa]
    cpu = [r["change"] for r in load("error_rates/cpu_tiny_abba.json")["rows"] if r["kind"] == "aa"]
    slow = [r for r in load("error_rates/gpu_h100_smollm2.json")["rows"] if r["kind"] == "slow0.2"]
    assert len(slow) == 2 and all(r["status"] == "fail" for r in slow)  # "failed in both tries"
    return (f"the A/A intervals were ±{min(half) * 100:.0f}-{max(half):.0%} (median ±{statistics.median(half):.1%}) and "
            f"a +20% step slowdown failed in both tries, [...] on the CPU that biased A/As by a median "
            f"−{-statistics.median(cpu):.0%}")


def gates_machine_drift() -> str:
    r3, r4 = (rung("ts4_500", o)["metrics"]["stage/decode_ms_mean"] for o in ("dynamic_batching", "chunked_prefill"))
    return f"its decode-only steps took {r4:.1f} ms on average against {r3:.1f} ms"


def gates_aa() -> str:
    s = load("aa_cpu/ab_summary.json")["summary"]
    latency = next(g for g in s["gates"] if g["gate"] == "latency_max_regression:perf/e2e_ms_p99")
    n = sum(s["verdicts"].values())
    assert s["verdicts"].get("fail", 0) == 0  # "no identical pair failed"
    return (f"{n} A/As of SmolLM2-135M: no identical pair failed; {latency['statuses']['inconclusive']} of {n} were "
            f"inconclusive on latency, [...] of log E2E p99 {latency['noise'][0]:.3f}")


def design_capacity_stop() -> str:
    ratios = load("cpu_capacity_stop/capstop_0.3.json")["ratios"]
    return f"took {min(ratios):.2f}-{max(ratios):.2f}× the time"


def soak(study: str) -> dict:
    d = load(f"{study}/soak.json")
    assert d["verdict"] == "pass"
    return {g["name"]: g["reason"] for g in d["gates"]} | {"d": d}


def full_windows(d: dict) -> int:
    """The soak's whole windows (a last one cut short by the end is its tail)."""
    return int(d["duration_s"] // d["config"]["window_s"])


def slope(reason: str) -> float:
    return float(re.search(r"grew \+([\d.]+) MiB/min", reason).group(1))


def p999(reason: str) -> str:
    """'E2E p99.9 321 ms in window 3, 275 ms in window 29 (0.86x, bound 1.5x)' -> the docs' wording."""
    return reason.replace(" ms in window", " ms in window").replace(", ", " and ", 1)


def reliability_soak_cpu() -> str:
    g = soak("soak_cpu")
    d = g["d"]
    load = [float(line.split()[1]) for line in (RESULTS / "soak_cpu" / "loadavg.txt").read_text().splitlines() if line]
    hangups = next(k["sent"] for k in d["bad_by_kind"] if k["kind"] == "disconnect")
    assert hangups == d["aborted"]
    return (f"**pass**. {d['requests']:,} requests and {d['bad_requests']} bad ones (every kind, {min(kinds(d))}-"
            f"{max(kinds(d))} each) over {full_windows(d)} one-minute windows; [...] and {hangups} hang-ups each "
            f"aborted), every KV block back in the pool; anonymous memory grew {slope(g['memory:anon_mib']):.2f} "
            f"MiB/min after warm-up [...] {p999(g['p999_stability'])}, the machine's 1-minute load average "
            f"{min(load):.2f}-{max(load):.2f}, median {statistics.median(load):.2f}")


def kinds(d: dict) -> list[int]:
    """Bad requests sent of each kind."""
    return [k["sent"] for k in d.get("bad_by_kind") or []]


def reliability_soak_h200() -> str:
    g = soak("soak_h200")
    d = g["d"]
    ttft = [w["latency_ms"]["ttft_p99"] for w in d["windows"]]
    n = full_windows(d)
    return (f"**pass**. {d['requests']:,} requests and {d['bad_requests']} bad ones ({min(kinds(d))}-{max(kinds(d))} of "
            f"each kind) over {NUMBERS[n]} one-minute windows and a {d['windows'][n]['requests']}-request tail; "
            f"[...] {d['aborted']} hang-ups "
            f"each aborted, [...] Anonymous host memory +{slope(g['memory:anon_mib']):.2f} MiB/min and device memory "
            f"+{slope(g['memory:device_mib']):.3f} MiB/min [...] {p999(g['p999_stability'])}; TTFT p99 "
            f"{min(ttft):.0f}-{max(ttft):.0f} ms per window.")


def scale_out_ray() -> str:
    rows = []
    for f, label in (("ray_vs_local_cpu.md", "8 requests, 8 quality prompts each"),
                     ("ray_vs_local_cpu_64.md", "64 requests, 64 quality prompts each (`NREQ=64 NPROMPTS=64`)")):
        t = md_table(RESULTS / f)
        local, ray = t["local (basic)"], t["ray"]
        rows.append(f"| {label} | {local['wall time s']} s | {ray['wall time s']} s | {ray['ratio to local']} |")
    return " [...] ".join(rows)


def http_overhead() -> str:
    text = (RESULTS / "http_overhead.md").read_text(encoding="utf-8")
    closed, burst = (md_table_at(text, head) for head in ("## closed, 300 in flight", "## open, burst of 300"))

    def s(cell: str) -> str:  # '+3,419' ms -> '+3.4'
        return f"+{float(cell.lstrip('+').replace(',', '')) / 1000:.1f}"
    std, asgi = closed["stdlib"], closed["asgi"]
    raw = load("http_overhead.json")["results"]  # per round, both loads: the stdlib server's TTFT p99 the lower
    pairs = [(a["perf/ttft_ms_p99"], b["perf/ttft_ms_p99"]) for m in raw.values() for a, b in zip(m["stdlib"], m["asgi"])]
    lower, rounds = sum(a < b for a, b in pairs), len(pairs)
    return (f"closed loop with 300 in flight, TTFT p99 {s(std['TTFT p99 added ms'])} s for the stdlib server against "
            f"{s(asgi['TTFT p99 added ms'])} s for the ASGI one [...] {std['CPU µs per token added']} vs "
            f"{asgi['CPU µs per token added']} CPU µs per token); a burst of 300 at once, TTFT p99 "
            f"{s(burst['stdlib']['TTFT p99 added ms'])} s against {s(burst['asgi']['TTFT p99 added ms'])} s, "
            f"lateness p99 (the client's own delay) {s(burst['stdlib']['lateness p99 added ms'])} s for both [...] "
            f"server had the lower TTFT p99 in {lower} of the {rounds} rounds")


def md_table_at(text: str, heading: str) -> dict[str, dict[str, str]]:
    """The first table after a heading: first column -> {header: cell}."""
    lines = [line for line in text.split(heading, 1)[1].split("\n## ")[0].splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return {cells[0]: dict(zip(head, cells)) for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}


# id: (the page, the study it must link, the line(s) rebuilt; "[...]" stands for text between two checked parts)
DOC_LINES = {
    "gates:flash_attn_answers": ("gates.md", "gpu_ladder_h200/README.md", gates_flash_attn_answers),
    "gates:near_tie": ("gates.md", "near_tie_calibration/README.md", gates_near_tie),
    "gates:error_rates": ("gates.md", "error_rates/README.md", gates_error_rates),
    "gates:machine_drift": ("gates.md", "gpu_ladder_h200/README.md", gates_machine_drift),
    "gates:aa": ("gates.md", "aa_cpu/README.md", gates_aa),
    "design:capacity_stop": ("design.md", "cpu_capacity_stop/README.md", design_capacity_stop),
    "reliability:soak_cpu": ("reliability.md", "soak_cpu/", reliability_soak_cpu),
    "reliability:soak_h200": ("reliability.md", "soak_h200/README.md", reliability_soak_h200),
    "reliability:http_overhead": ("reliability.md", "http_overhead.md", http_overhead),
    "scale-out:ray": ("scale-out.md", "ray_vs_local_cpu_64.md", scale_out_ray),
}


def quoted(page: str, expected: str) -> bool:
    """Every '[...]'-separated part of the rebuilt line in the page, in that order."""
    at = 0
    for part in expected.split(" [...] "):
        at = page.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


@pytest.mark.parametrize("line", sorted(DOC_LINES))
def test_the_docs_figure_is_what_the_committed_result_says(line):
    name, study, rebuild = DOC_LINES[line]
    page = doc(name)
    assert f"(../benchmarks/results/{study})" in page, f"docs/{name} does not link {study}"
    expected = rebuild()
    assert quoted(page, expected), f"docs/{name} does not say: {expected}"


def test_a_changed_docs_figure_fails_the_check():
    """The check is not vacuous: one figure changed in a page's text is no longer found."""
    page = doc("gates.md")
    expected = gates_aa()
    assert quoted(page, expected)
    assert not quoted(page.replace("0.134", "0.135"), expected)
