"""Mutation testing with mutmut over the bookkeeping the project's numbers rest on: small bugs planted one at
a time (an operator flipped, a constant changed, an argument dropped) in traffic/, abtest/,
optladder/quality/scoring.py and the engine's block manager and scheduler; each must make a fast test fail.

    .venv/bin/python benchmarks/mutation.py                      # every group; results/mutation.md
    .venv/bin/python benchmarks/mutation.py abtest scoring       # some groups
    .venv/bin/python benchmarks/mutation.py --list               # the groups and their test selections
    .venv/bin/python benchmarks/mutation.py --combine a.json b.json   # one report from separate runs

Each group runs in a scratch copy of the checkout (tracked and untracked files, not ignored ones) with its own
mutmut config: the files to mutate and the fast tests that may kill them (mutmut runs, per mutant, only the
selected tests that reach the mutated function). A mutant no selected test reaches counts as surviving.
Not for CI: a group takes minutes to an hour on a 2-core machine. `make mutation` installs mutmut (the
`mutation` extra) and runs every group (`make mutation MUTATION_GROUPS=abtest` some).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PACKAGES = ["optladder", "hydra_plugins", "run.py"]


@dataclass
class Group:
    mutate: list[str]
    tests: list[str]
    skip: list[str] = field(default_factory=list)  # files left alone, with the reason in `why`
    why: str = ""
    forkserver: bool = False  # tests that run torch: a fork of a process with OpenMP threads may hang


# Code never mutated: log messages and the functions that draw charts. A planted bug there changes a sentence
# in a log or a picture's styling, not a number a verdict or a metric rests on (ladder_chart, for one, only
# hands the rungs' metrics to matplotlib; a test would have to compare pixels).
# QUIET_LINES go to mutmut's do_not_mutate_patterns, which (mutmut 3.8) spares only the expressions that
# *start* on a matching line: fine for a log call, but a pattern on a `def` line spares nothing inside the
# function. So a function whose `def` line matches QUIET_FUNCTIONS gets, in the scratch copy only, a
# `# pragma: no mutate block` after its signature, which makes mutmut skip the whole function.
QUIET_LINES = [r"\blog\.(debug|info|warning|error|exception)\("]
QUIET_FUNCTIONS = [r"^def \w+_chart\("]


GROUPS = {
    "block_manager": Group(["optladder/engine/block_manager.py"], ["tests/test_block_manager.py",
                                                         "tests/test_block_manager_cache.py"]),
    "scheduler": Group(["optladder/engine/scheduler.py"], ["tests/test_scheduler.py"]),
    "traffic": Group(
        ["traffic/"],
        ["tests/test_metrics.py", "tests/test_sampling.py", "tests/test_traces.py", "tests/test_capacity.py",
         "tests/test_workload.py", "tests/test_http_driver.py::test_token_stream_parsing",
         "tests/test_http_driver.py::test_payload_sends_token_ids_and_asks_for_exact_lengths",
         "tests/test_http_driver.py::test_bad_config_is_refused", "tests/test_load_levels.py",
         "tests/test_replay_config.py"],
        skip=["optladder/traffic/http_driver.py", "optladder/traffic/locust_worker.py", "optladder/traffic/replay.py", "optladder/traffic/thread_client.py",
              "optladder/traffic/bad_requests.py"],
        why="the HTTP clients (the locust driver and its worker, the thread client, the bad-request sender) run "
            "against a live server (their tests take minutes and mutmut cannot see which test reaches which "
            "function in another process; tests/test_soak.py runs them end to end); the in-process driver has "
            "its own group, `replay`, since each of its mutants needs a real engine"),
    "replay": Group(["optladder/traffic/replay.py"], ["tests/test_replay.py"], forkserver=True),
    "abtest": Group(["abtest/"], ["tests/test_gates.py", "tests/test_abtest_stats.py", "tests/test_verdict.py",
                                  "tests/test_gate_config.py", "tests/test_paired_stats.py", "tests/test_rollout.py",
                                  "tests/test_lossless.py", "tests/test_ladder.py", "tests/test_soak.py",
                                  "tests/test_soak_gates.py", "tests/test_sweep_summary.py", "tests/test_teacher_forced.py",
                                  "tests/test_aa.py::test_sweep_summary_measures_run_noise_and_covers_zero_out_of_sample",
                                  "--deselect", "tests/test_ladder.py::test_ladder_through_run_py_on_the_tiny_model",
                                  "--deselect",
                                  "tests/test_ladder.py::test_a_resumed_ladder_reads_back_the_rungs_that_finished_and_runs_the_rest",
                                  "--deselect", "tests/test_ladder.py::test_an_earlier_rung_of_other_settings_or_data_is_not_taken",
                                  "--deselect", "tests/test_soak.py::test_a_short_soak_end_to_end",
                                  "--deselect", "tests/test_soak.py::test_every_soak_config_composes",
                                  "--deselect",
                                  "tests/test_teacher_forced.py::test_real_engines_identical_measure_zero_and_damaged_fail"]),
    "scoring": Group(["optladder/quality/scoring.py"], ["tests/test_quality.py"]),
}


def scratch_copy(dest: Path) -> None:
    """The checkout as git sees it (tracked and untracked, not ignored), so local edits are what is tested."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def quiet_functions(work: Path, group: Group) -> list[str]:
    """Mark the functions QUIET_FUNCTIONS names, in the scratch copy's mutated files, `no mutate block`.
    Returns `path:function` for each one marked."""
    marked = []
    for target in group.mutate:
        root = work / target
        for path in sorted(root.rglob("*.py") if root.is_dir() else [root]):
            lines = path.read_text().split("\n")
            changed = False
            for i, line in enumerate(lines):
                if not any(re.search(p, line) for p in QUIET_FUNCTIONS):
                    continue
                end = i  # the signature's last line: the first that ends with ':' (after a return annotation)
                while end < len(lines) and not lines[end].rstrip().endswith(":"):
                    end += 1
                if end < len(lines) and "#" not in lines[end]:
                    lines[end] = lines[end].rstrip() + "  # pragma: no mutate block"
                    changed = True
                    name = re.match(r"def (\w+)", line)
                    marked.append(f"{path.relative_to(work)}:{name.group(1) if name else i + 1}")
            if changed:
                path.write_text("\n".join(lines))
    return marked


def write_config(work: Path, group: Group) -> None:
    tests = [t for t in group.tests if t.startswith("-") or (work / t.split("::")[0]).exists()]
    lines = ["[mutmut]", "source_paths =", *(f"    {p}" for p in group.mutate),
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests),
             "pytest_add_cli_args =", "    -p", "    no:cacheprovider", "also_copy =",
             *(f"    {p}" for p in PACKAGES)]
    if group.skip:
        lines += ["do_not_mutate =", *(f"    {p}" for p in group.skip)]
    lines += ["do_not_mutate_patterns =", *(f"    {p}" for p in QUIET_LINES)]
    if group.forkserver:
        lines += ["process_isolation = forkserver"]
    (work / "setup.cfg").write_text("\n".join(lines) + "\n")


# Every mutant not killed, with its diff, in one process (`mutmut show` per mutant starts one each).
SURVIVORS = """
import json
from mutmut.__main__ import SourceFileMutationData, status_by_exit_code, walk_mutatable_files
from mutmut.mutation.diff_apply import get_diff_for_mutant
out = []
for path in walk_mutatable_files():
    m = SourceFileMutationData(path=path)
    m.load()
    for name, code in m.exit_code_by_key.items():
        status = status_by_exit_code[code]
        if status in ("survived", "no tests"):
            diff = [d for d in get_diff_for_mutant(name, path=path).splitlines()
                    if d[:1] in "-+" and not d.startswith(("---", "+++"))]
            out.append({"mutant": name, "status": status, "diff": diff})
print(json.dumps(out))
"""


def mutmut(work: Path, *args: str, log=None) -> str:
    p = subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=work, text=True,
                       stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT)
    return "" if log else p.stdout


def run_group(name: str, group: Group, keep: Path | None, max_children: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"optladder-mutation-{name}-", dir=keep))
    scratch_copy(work)
    quiet_functions(work, group)
    write_config(work, group)
    t0 = time.monotonic()
    with open(work / "mutmut-run.log", "w") as log:
        mutmut(work, "run", "--max-children", str(max_children), log=log)
    mutmut(work, "export-cicd-stats")
    stats_file = work / "mutants" / "mutmut-cicd-stats.json"
    if not stats_file.exists():
        tail = (work / "mutmut-run.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"mutmut produced no results for {name}; the end of its log:\n{tail}")
    stats = json.loads(stats_file.read_text())
    if stats["total"] - stats["skipped"] > 0 and stats["killed"] + stats["timeout"] + stats["survived"] == 0:
        # mutmut's first run of the unmutated tests failed: nothing was tested, which is not 0% surviving
        tail = (work / "mutmut-run.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"mutmut tested no mutant of {name}: the selected tests fail on the unmutated code? "
                           f"The end of its log:\n{tail}")
    survivors = json.loads(subprocess.run([sys.executable, "-c", SURVIVORS], cwd=work, text=True, check=True,
                                          capture_output=True).stdout)
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return {"group": name, "mutate": group.mutate, "tests": group.tests, "skip": group.skip, "why": group.why,
            "stats": stats, "survivors": survivors, "minutes": (time.monotonic() - t0) / 60}


def survival(stats: dict) -> tuple[int, int]:
    alive = stats["survived"] + stats["no_tests"]
    return alive, stats["total"] - stats["skipped"]


def report(results: list[dict]) -> str:
    lines = ["| group | mutated | mutants | killed | timeout | survived | no test reached | surviving |",
             "|---|---|---|---|---|---|---|---|"]
    alive_all = total_all = 0
    for r in results:
        s = r["stats"]
        alive, total = survival(s)
        alive_all, total_all = alive_all + alive, total_all + total
        lines.append(f"| {r['group']} | {', '.join(r['mutate'])} | {total} | {s['killed']} | {s['timeout']} | "
                     f"{s['survived']} | {s['no_tests']} | {alive / max(total, 1):.1%} |")
    lines.append(f"| all | | {total_all} | | | | | {alive_all / max(total_all, 1):.1%} |")
    for r in results:
        if r["skip"]:
            lines += ["", f"{r['group']}: not mutated: {', '.join(r['skip'])} ({r['why']})."]
    lines += ["", "Surviving mutants (each line pair: the original line, then the mutant's):"]
    for r in results:
        for sv in r["survivors"]:
            lines += ["", f"- `{sv['mutant']}` ({sv['status']})", *(f"      {d}" for d in sv["diff"])]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("groups", nargs="*", help=f"some of {list(GROUPS)} (default: all)")
    p.add_argument("--list", action="store_true", help="print the groups and their test selections")
    p.add_argument("--out", type=Path, default=RESULTS / "mutation.md")
    p.add_argument("--keep", type=Path, default=None, help="keep the scratch copies under this folder")
    p.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    p.add_argument("--combine", nargs="+", type=Path, default=None,
                   help="write one report from the .json files of earlier runs (run nothing)")
    args = p.parse_args()
    if args.combine:
        results = [r for f in args.combine for r in json.loads(f.read_text())]
        args.out.write_text(report(results) + "\n")
        print(f"wrote {args.out}")
        return 0
    if args.list:
        for name, g in GROUPS.items():
            print(f"{name}: mutate {g.mutate} (skip {g.skip}); tests {g.tests}")
        return 0
    names = args.groups or list(GROUPS)
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        p.error(f"unknown group(s) {unknown}; valid: {list(GROUPS)}")
    results = []
    for name in names:
        print(f"mutation: {name} ...", flush=True)
        results.append(run_group(name, GROUPS[name], args.keep, args.max_children))
        alive, total = survival(results[-1]["stats"])
        print(f"  {total} mutants, {alive} surviving ({alive / max(total, 1):.1%}), "
              f"{results[-1]['minutes']:.1f} min", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(results) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
