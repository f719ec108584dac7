"""The README's headline figures, regenerated from the committed results they quote (issue 44, item 5).

Each covered row of the headline table ("What it measured") has its result cell rendered here from the files
under benchmarks/results/ and compared with the README's cell as a whole: a re-run that changes a committed
result but not the README fails, and so does a README edit that no result backs. The first sweep's job counts
are taken from the registry the sweep reads (optladder/engine/opts.py), as the sweep itself takes them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def readme_cell(study: str) -> str:
    """The results cell (4th column) of the headline row that links the study's page."""
    link = f"](benchmarks/results/{study}/README.md) |"
    rows = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("|") and line.endswith(link)]
    assert len(rows) == 1, f"README.md: {len(rows)} headline rows link {study}"
    return [c.strip() for c in rows[0].strip("|").split("|")][3]


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


ROWS = {"cpu_switches": cpu_switches, "gpu_h200": gpu_h200, "gpu_ab_vllm_h200": gpu_ab_vllm, "aa_cpu": aa_cpu,
        "gpu_quant_h200": gpu_quant, "speculative": speculative}


@pytest.mark.parametrize("study", sorted(ROWS))
def test_the_readme_headline_row_is_what_the_committed_result_says(study):
    assert readme_cell(study) == ROWS[study]()


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
