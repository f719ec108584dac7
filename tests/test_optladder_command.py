"""The `optladder` command's dispatch (optladder/cli.py main): each experiment subcommand becomes the Hydra
app's arguments, each tool subcommand its module's main; bad input names the valid values. And `optladder
bench latency` measured for real on the tiny model."""
from __future__ import annotations

import sys

import pytest

from optladder import cli
from optladder.bench import main as bench_main


@pytest.fixture
def hydra_argv(monkeypatch):
    """What the Hydra app would parse: cli() is where run.py enters too, so the dispatch ends there."""
    seen: list[list[str]] = []

    def fake_cli():
        seen.append(list(sys.argv))
        raise SystemExit(0)

    monkeypatch.setattr(cli, "cli", fake_cli)
    return seen


@pytest.mark.parametrize("args, expect", [
    (["run", "+opt=flash_attn", "seed=1"], ["+opt=flash_attn", "seed=1"]),
    (["sweep", "+opt=glob(*)"], ["-m", "+opt=glob(*)"]),
    (["ab", "flash_attn", "engine.dtype=bfloat16"], ["+ab=flash_attn", "engine.dtype=bfloat16"]),
    (["ladder", "seed"], ["+ladder=seed"]),
    (["soak", "cpu", "model=tiny"], ["+soak=cpu", "model=tiny"]),
])
def test_experiment_subcommands_become_hydra_overrides(hydra_argv, args, expect):
    with pytest.raises(SystemExit):
        cli.main(args)
    assert hydra_argv == [["optladder", *expect]]


@pytest.mark.parametrize("group, a_name", [("ab", "'aa'"), ("ladder", "'seed'"), ("soak", "'cpu'")])
def test_a_group_subcommand_without_a_name_lists_the_names(hydra_argv, capsys, group, a_name):
    with pytest.raises(SystemExit) as e:
        cli.main([group, "seed=1"])
    err = capsys.readouterr().err
    assert e.value.code == 3 and hydra_argv == []
    assert f"optladder {group} needs a NAME first" in err and a_name in err


def test_unknown_command_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["ladders"])
    assert e.value.code == 2 and "unknown command 'ladders'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for name in [*cli.HYDRA_COMMANDS, *cli.TOOLS]:
        assert f"  {name} " in out


def test_tool_subcommands_reach_their_module(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "--help"])
    assert e.value.code == 0 and "usage: optladder compare" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["import-runs", "--help"])  # runs_transfer's import parser, reached through its lead argument
    assert e.value.code == 0 and "--to" in capsys.readouterr().out


def test_bench_refuses_unknown_names_before_loading_anything(capsys):
    assert bench_main(["throughput"]) == 2 and "valid: ['latency', 'switches']" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--opt 'flash_atn' is not one of \[.*'flash_attn'"):
        bench_main(["latency", "--opt", "flash_atn"])
    with pytest.raises(SystemExit, match=r"--model 'tiny2' is not one of"):
        bench_main(["latency", "--model", "tiny2"])


def test_bench_latency_measures_both_configurations(capsys):
    assert bench_main(["latency", "--model", "tiny", "--device", "cpu", "--batch", "1", "2", "--tokens", "4",
                       "--prompt-len", "16", "--repeats", "1", "--opt", "paged_kv"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert "| ratio |" in out and len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        base, cand, ratio = float(cells[1]), float(cells[2]), float(cells[-1])
        assert base > 0 and cand > 0 and ratio == pytest.approx(cand / base, rel=0.01, abs=0.001)
