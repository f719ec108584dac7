"""The import structure drawn from the code itself (ast over every .py of the packages), checked against
docs/design.md's floors: run.py -> cli -> experiments -> abtest / backends / traffic / quality -> serving -> engine
(-> paths, which every floor may use), all under the one package optladder/.

An import may go down or sideways to another package of its own floor, never up; no two modules and no two
packages import each other, directly or round a longer loop (an import inside a function counts too); Hydra
and OmegaConf stay in run.py, optladder/cli.py, optladder/bench/ and optladder/experiments/. The checker is tested on planted mistakes first, so a clean
result on the real tree means something."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"run": 6, "cli": 5, "bench": 5, "experiments": 4, "abtest": 3, "backends": 3, "traffic": 3, "quality": 3,
          "serving": 2, "engine": 1, "paths": 0, "optladder": 0}
HYDRA = ("hydra", "omegaconf")
HYDRA_ALLOWED = ("run", "cli", "bench", "experiments")
PKG = "optladder"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for run.py and every .py of the package."""
    out = {"run": root / "run.py"} if (root / "run.py").exists() else {}
    for f in sorted((root / PKG).rglob("*.py")) if (root / PKG).is_dir() else []:
        parts = f.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imported_names(mod: str, path: Path, modules: set[str]) -> set[str]:
    """Every module an import statement in the file names, relative imports resolved; `from pkg import
    name` names pkg.name where that is a module, else pkg."""
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules (and hydra/omegaconf) it imports."""
    files = module_files(root)
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps = set()
        for name in imported_names(mod, path, set(files)):
            if name.split(".")[0] in HYDRA:
                deps.add(name.split(".")[0])
            elif name in files and name != mod:
                deps.add(name)
        graph[mod] = deps
    return graph


def top(mod: str) -> str:
    """The floor's name: run, or the package's first level (optladder.engine.model -> engine)."""
    parts = mod.split(".")
    return parts[1] if parts[0] == PKG and len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if d in graph and FLOORS[top(d)] > FLOORS[top(m)])


def hydra_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if d in HYDRA and top(m) not in HYDRA_ALLOWED)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    pkgs: dict[str, set[str]] = {top(m): set() for m in graph}
    for m, deps in graph.items():
        pkgs[top(m)].update(top(d) for d in deps if d in graph and top(d) != top(m))
    return pkgs


# --- the checker catches planted mistakes ---

def plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_checker_finds_an_upward_import_inside_a_function(tmp_path):
    root = plant(tmp_path, {"optladder/engine/__init__.py": "",
                            "optladder/engine/core.py": "def f():\n    from optladder.experiments import x\n",
                            "optladder/experiments/__init__.py": "", "optladder/experiments/x.py": "import optladder.engine.core\n"})
    graph = import_graph(root)
    assert upward_imports(graph) == ["optladder.engine.core -> optladder.experiments.x"]
    assert cycles(graph) == [["optladder.engine.core", "optladder.experiments.x"]]


def test_checker_finds_a_lateral_circle_and_a_relative_one(tmp_path):
    root = plant(tmp_path, {"optladder/abtest/__init__.py": "", "optladder/abtest/a.py": "from optladder.traffic.b import y\n",
                            "optladder/traffic/__init__.py": "", "optladder/traffic/b.py": "from optladder.abtest import a\n",
                            "optladder/quality/__init__.py": "", "optladder/quality/p.py": "from . import q\n",
                            "optladder/quality/q.py": "from .p import z\n"})
    graph = import_graph(root)
    assert upward_imports(graph) == []  # same floor: sideways is allowed, a loop is not
    assert cycles(graph) == [["optladder.abtest.a", "optladder.traffic.b"], ["optladder.quality.p", "optladder.quality.q"]]
    assert cycles(package_graph(graph)) == [["abtest", "traffic"]]


def test_checker_finds_hydra_below_experiments(tmp_path):
    root = plant(tmp_path, {"optladder/abtest/__init__.py": "", "optladder/abtest/g.py": "from omegaconf import DictConfig\n",
                            "optladder/experiments/__init__.py": "", "optladder/experiments/e.py": "import hydra\n"})
    assert hydra_imports(import_graph(root)) == ["optladder.abtest.g -> omegaconf"]


def test_checker_finds_one_bad_import_planted_in_a_copy_of_the_tree(tmp_path):
    import shutil

    shutil.copytree(ROOT / PKG, tmp_path / PKG, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "run.py", tmp_path / "run.py")
    assert upward_imports(import_graph(tmp_path)) == []
    opts = tmp_path / PKG / "engine" / "opts.py"
    opts.write_text(opts.read_text() + "\n\ndef _late():\n    from optladder.experiments.schema import Config\n")
    graph = import_graph(tmp_path)
    assert upward_imports(graph) == ["optladder.engine.opts -> optladder.experiments.schema"]
    assert any("optladder.engine.opts" in c for c in cycles(graph))  # experiments.schema imports engine.opts


# --- the real tree ---

@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT)


def test_the_tree_is_seen(graph):
    """A checker that saw nothing would pass everything: the known edges must be there."""
    assert {"optladder.engine.llm_engine", "optladder.serving.server", "optladder.experiments.experiment", "run",
            "optladder.cli"} <= set(graph)
    assert "optladder.engine.llm_engine" in graph["optladder.serving.server"]
    assert "optladder.experiments.schema" in graph["optladder.cli"] and graph["run"] == {"optladder.cli"}


def test_no_import_runs_back_up_the_floors(graph):
    assert upward_imports(graph) == []


def test_no_circles_between_modules_or_packages(graph):
    assert cycles(graph) == []
    assert cycles(package_graph(graph)) == []


def test_hydra_only_at_the_top(graph):
    assert hydra_imports(graph) == []


def test_engine_imports_only_itself(graph):
    foreign = {d for m, deps in graph.items() if top(m) == "engine" for d in deps if top(d) not in ("engine", "paths")}
    assert foreign == set()


def test_the_readme_layout_names_every_folder_and_conf_group():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```")[1]
    named = {line.split()[0].rstrip("/") for line in block.splitlines() if line and not line.startswith(" ")}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout: which folders belong to the project is git's to say")
    folders = {f.split("/")[0] for f in tracked if "/" in f and not f.startswith(".")}
    assert named == folders | {"run.py"}
    groups = {p.name for p in (ROOT / "optladder" / "conf").iterdir() if p.is_dir()}
    conf_lines = " ".join(line for line in block.splitlines() if line.startswith("  "))
    assert {g for g in groups if f"{g}/" not in conf_lines} == set()
