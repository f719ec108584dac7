"""Where data files are found: an absolute path as it is, a relative one under the data root (the config key
`data.root`, else the environment variable OPTLADDER_DATA, else the current directory)."""
from __future__ import annotations

import os
from pathlib import Path

from optladder.paths import refuse_directory

DATA_ENV = "OPTLADDER_DATA"


def resolve_data_path(path: str, data_root: str | None) -> Path:
    """Absolute paths as they are; relative ones under data_root (else $OPTLADDER_DATA, else the cwd).
    FileNotFoundError when nothing is there (naming where it looked and how to set the data root);
    IsADirectoryError when a directory is (naming a few of its files)."""
    p = Path(path).expanduser()
    root = None if p.is_absolute() else (data_root or os.environ.get(DATA_ENV))
    full = Path(root).expanduser() / p if root else p
    refuse_directory(f"data file {path!r}", full)  # found, but a folder: setting the data root would not help
    if not full.is_file():
        searched = f"data root {root!r}" if root else ("no data root (absolute path)" if p.is_absolute()
                                                        else "no data root set, so the current directory")
        raise FileNotFoundError(
            f"data file {path!r} not found at {full} (searched: {searched}); set data.root=<folder> "
            f"or the environment variable {DATA_ENV} to the folder that holds it, or give an absolute path")
    return full
