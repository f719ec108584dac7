"""Where things are: the package's own files, and the project root that relative paths start from.

In a checkout (an editable install, or run.py) the project root is the checkout, so every run of it lands in
one MLflow database, one cache and one rollout registry there. From an installed package it is the directory
the command runs in, or $OPTLADDER_HOME where set. No imports of the project: every floor may use it."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CONF_DIR = PACKAGE / "conf"


def _checkout() -> Path | None:
    parent = PACKAGE.parent
    return parent if (parent / "pyproject.toml").is_file() and (parent / "run.py").is_file() else None


def conf_options(group: str) -> list[str]:
    """The options of a config group: the names of optladder/conf/<group>/*.yaml."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


CHECKOUT = _checkout()
PROJECT_ROOT = Path(os.environ["OPTLADDER_HOME"]).resolve() if os.environ.get("OPTLADDER_HOME") \
    else CHECKOUT or Path.cwd()

MAX_LISTED = 5  # files of a directory named where a file was wanted


def refuse_directory(label: str, full: Path) -> None:
    """IsADirectoryError when `full` (what `label` names: a data file, quality.path) is a directory: say so and
    name a few of its files, rather than 'not found' with advice (set the data root) that would not help."""
    if not full.is_dir():
        return
    inside = sorted(c.name for c in full.iterdir() if c.is_file())
    holds = (f"it holds {', '.join(inside[:MAX_LISTED])}{', ...' if len(inside) > MAX_LISTED else ''}"
             if inside else "it holds no files")
    raise IsADirectoryError(f"{label} is a directory ({full}), not a file: give the path of the file itself "
                            f"({holds})")
