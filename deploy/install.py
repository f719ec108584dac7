"""On the GPU host (no registry): put a wheelhouse back together, check every sha256, install with --no-index.
Standard library only: it runs on the image's bare python3 before anything is installed.

    python3 wheelhouse/install.py --target /tmp/site      # then: export PYTHONPATH=/tmp/site
    python3 wheelhouse/install.py --venv .venv-gpu        # a venv that also sees the image's torch & co.
    python3 wheelhouse/install.py --stage                 # a transfer that brings some chunks only: keep them

Chunks may come in several transfers: each call copies the c*/ folders beside it to the stage folder
(--stage-dir, /tmp/wheelhouse-stage), and the install takes every part from there. A part that never came,
or a file whose sha256 differs from the manifest's, stops it before anything is installed, naming the file.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Refused(Exception):
    pass


def stage(src: Path, stage_dir: Path) -> int:
    """Copies the chunk folders that came with this transfer; returns how many."""
    n = 0
    for c in sorted(src.glob("c[0-9]*")):
        if c.is_dir():
            shutil.copytree(c, stage_dir / c.name, dirs_exist_ok=True)
            n += 1
    return n


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()


def assemble(manifest: Path, stage_dir: Path, wheels: Path) -> list[Path]:
    """Every file of the manifest from its parts, checked; raises Refused naming what is missing or wrong."""
    wheels.mkdir(parents=True, exist_ok=True)
    missing, bad, out = [], [], []
    for line in manifest.read_text().splitlines():
        if not line.strip():
            continue
        name, size, digest, parts = line.split("\t")
        absent = [p for p in parts.split(",") if not (stage_dir / p).is_file()]
        if absent:
            missing.append(f"{name} (part {', '.join(absent)} did not arrive)")
            continue
        dest = wheels / name
        with open(dest, "wb") as fo:
            for p in parts.split(","):
                fo.write((stage_dir / p).read_bytes())
        got = sha256(dest)
        if dest.stat().st_size != int(size) or got != digest:
            bad.append(f"{name}: sha256 {got[:16]}..., {dest.stat().st_size} bytes; the manifest says "
                       f"{digest[:16]}..., {size} bytes")
            dest.unlink()
            continue
        out.append(dest)
    if bad:
        raise Refused("sha256 mismatch, refusing to install anything:\n  " + "\n  ".join(bad))
    if missing:
        raise Refused("missing from the wheelhouse, nothing installed:\n  " + "\n  ".join(missing))
    return out


def dist_name(wheel: str) -> str:
    return re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()


def unmet(python: str, ours: set[str], env: dict[str, str] | None = None) -> list[str]:
    """`pip check`, read for the wheelhouse's own packages only (the image may have quarrels of its own):
    what they need that neither the wheelhouse nor the image brings, or brings in a version they refuse."""
    p = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, env=env)
    found = re.finditer(r"^(\S+) \S+ (?:requires|has requirement) ([^,]+?)(?:,| which)", p.stdout, re.M)
    return sorted({f"{m.group(2).strip()} (needed by {m.group(1)})" for m in found if dist_name(m.group(1)) in ours})


def install_target(wheels: list[Path], target: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--upgrade",
           "--quiet", "--target", str(target), *map(str, wheels)]
    if subprocess.run(cmd).returncode:
        raise Refused("pip install failed (see above)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    return unmet(sys.executable, {dist_name(w.name) for w in wheels}, env)


def install_venv(wheel_dir: Path, requirements: Path, venv: Path) -> list[str]:
    if not (venv / "bin" / "python").exists():
        # the image's own packages (torch, transformers, ...) stay visible: they are what was skipped
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    p = subprocess.run([py, "-m", "pip", "install", "--no-index", "--find-links", str(wheel_dir), "--quiet",
                        "-r", str(requirements)], capture_output=True, text=True)
    if p.returncode:
        names = re.findall(r"No matching distribution found for (\S+)", p.stderr)
        raise Refused("missing wheel(s), neither in the wheelhouse nor on this host: " + ", ".join(names)
                      if names else f"pip install failed:\n{p.stderr[-3000:]}")
    return unmet(py, {dist_name(w.name) for w in wheel_dir.glob("*.whl")})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Install a wheelhouse offline, checking its sha256s")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", type=Path, help="pip --target folder (then PYTHONPATH=it)")
    where.add_argument("--venv", type=Path, help="a venv with the system site packages")
    where.add_argument("--stage", action="store_true", help="only keep the chunks of this transfer")
    ap.add_argument("--from", dest="src", type=Path, default=HERE, help="the wheelhouse folder (default: here)")
    ap.add_argument("--stage-dir", type=Path, default=Path("/tmp/wheelhouse-stage"))
    a = ap.parse_args(argv)
    a.stage_dir.mkdir(parents=True, exist_ok=True)
    n = stage(a.src, a.stage_dir)
    print(f"wheelhouse: {n} chunk folder(s) staged in {a.stage_dir}", flush=True)
    if a.stage:
        return 0
    try:
        wheels = assemble(a.src / "manifest.tsv", a.stage_dir, a.stage_dir / "wheels")
        print(f"wheelhouse: {len(wheels)} wheels, every sha256 as in the manifest", flush=True)
        if a.target:
            left = install_target(wheels, a.target)
        else:
            left = install_venv(a.stage_dir / "wheels", a.src / "requirements.txt", a.venv)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if left:
        print("error: installed, but these requirements are met neither by the wheelhouse nor by this host "
              "(rebuild with `make wheelhouse CARRY=NAME`):\n  " + "\n  ".join(left), file=sys.stderr)
        return 1
    print(f"wheelhouse: installed into {a.target or a.venv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
