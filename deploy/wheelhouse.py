"""`make wheelhouse`: every wheel the project (and its extras, and `vllm serve` beyond the offline vLLM bundle)
needs on a GPU host that reaches no registry, less what the GPU image brings; run where a registry is reached.

    python deploy/wheelhouse.py --out wheelhouse [--python 3.12] [--platform manylinux_2_28_x86_64]
                                [--extras ray,slurm,postgres] [--no-vllm-serve] [--carry NAME] [--chunk-mib 56]
    python deploy/wheelhouse.py --out .vllm-serve-wheels --only-vllm-serve   # `vllm serve`'s part alone

--only-vllm-serve: only what `vllm serve` needs beyond the offline vLLM bundle and the image (vllm_serve.txt and
its closure, less the bundle's own wheels, vllm_bundle.txt, as well as the image's), installed beside the bundle
(`install.py --from DIR --target /tmp/site --stage-dir /tmp/serve-stage`), so the vLLM server runs from the bundle's
folder alone while the project's own wheelhouse, built with --no-vllm-serve, goes into a folder of its own.

1. pip resolves the whole closure for the target interpreter and platform (`--dry-run --report`, wheels only);
   a requirement with no wheel at all is downloaded as an sdist and built here (pure-Python only: a platform
   wheel built on this machine would not fit the target), then the closure is resolved again.
2. What deploy/gpu_image.txt lists is skipped (skipped.txt says which, and the version pip would have taken).
3. The rest is downloaded, written to manifest.tsv (name, size, sha256, parts) and requirements.txt, and split
   into chunk folders c1, c2, ... of at most --chunk-mib MiB each (a file larger than that is split in parts).
deploy/install.py puts it back together on the GPU host, checks every sha256 and installs with --no-index.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MIB = 1 << 20
MIN_PIECE = MIB  # a chunk's room below this is left empty rather than holding a sliver of a file


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_list(path: Path) -> list[str]:
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def project_requirements(extras: list[str]) -> list[str]:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(proj["dependencies"])
    known = proj.get("optional-dependencies", {})
    for e in extras:
        if e not in known:
            raise SystemExit(f"error: extra {e!r} is not one of {sorted(known)}")
        reqs += [r for r in known[e] if not r.startswith("optladder")]
    return reqs


def image_skips(lines: list[str], carry: list[str]) -> list[tuple[str, str | None]]:
    """(name pattern, the image's version if known); --carry names are never skipped."""
    out = []
    for ln in lines:
        name, _, version = ln.partition("==")
        if normalize(name) not in {normalize(c) for c in carry}:
            out.append((normalize(name), version or None))
    return out


def skipped_by(name: str, skips: list[tuple[str, str | None]]) -> tuple[str, str | None] | None:
    n = normalize(name)
    return next((s for s in skips if fnmatch.fnmatch(n, s[0])), None)


def platform_args(python: str, platform: str) -> list[str]:
    """pip's target flags; a manylinux_2_N platform also takes every older glibc tag (pip wants each listed)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    plats = [platform]
    if m:
        glibc, arch = int(m.group(1)), m.group(2)
        plats += [f"manylinux_2_{v}_{arch}" for v in range(glibc - 1, 16, -1)]
        plats += [f"{legacy}_{arch}" for legacy in ("manylinux2014", "manylinux2010", "manylinux1")]
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for p in plats:
        args += ["--platform", p]
    return args


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def resolve(reqs: list[str], pins: list[str], plat: list[str], local: Path, work: Path) -> list[dict]:
    """The closure for the target, preferring the vLLM bundle's versions (pins). A requirement with no wheel
    at all (pip: no matching distribution, or a conflict naming it) is built from its sdist into `local`; a
    bundle pin that conflicts with the project's needs is dropped (the project's copy then comes first on
    the GPU host's path). Then the resolve runs again."""
    tried: set[str] = set()
    pins = list(pins)
    for _ in range(30):
        report, constraints = work / "report.json", work / "constraints.txt"
        constraints.write_text("\n".join(pins) + "\n")
        p = pip("install", "--dry-run", "--ignore-installed", "--report", str(report), "--target",
                str(work / "t"), "--find-links", str(local), "-c", str(constraints), *plat, *reqs)
        if p.returncode == 0:
            return [i["metadata"] for i in json.loads(report.read_text())["install"]]
        out = p.stdout + p.stderr
        pinned = re.findall(r"The user requested \(constraint\) (\S+)", out)
        if pinned:
            print(f"  the bundle's {', '.join(pinned)} conflicts with the project's requirements: not pinned", flush=True)
            pins = [x for x in pins if x not in pinned]
            continue
        specs = re.findall(r"No matching distribution found for (\S+)", out) or re.findall(r"depends on (\S+)", out)
        new = [s for s in dict.fromkeys(specs) if s not in tried]
        tried.update(new)
        missing = [s for s in new if not has_wheel(s, plat, local, work)]
        if not missing:
            raise SystemExit(f"error: pip could not resolve the requirements:\n{out[-3000:]}")
        for spec in missing:
            build_sdist(spec, local, work)
    raise SystemExit("error: the resolve did not settle after 30 rounds")


def has_wheel(spec: str, plat: list[str], local: Path, work: Path) -> bool:
    p = pip("download", "--no-deps", "-q", "-d", str(work / "probe"), "--find-links", str(local), *plat, spec)
    return p.returncode == 0


def build_sdist(req: str, local: Path, work: Path) -> None:
    """A requirement with no wheel for any platform: its sdist, built into a wheel here."""
    print(f"  {req}: no wheel on the index, building one from its sdist", flush=True)
    sd = work / "sdist"
    p = pip("download", "--no-deps", "--no-binary=:all:", "-d", str(sd), req)
    if p.returncode:
        raise SystemExit(f"error: {req} has no wheel for the target and no sdist either:\n{p.stderr[-2000:]}")
    before = set(local.glob("*.whl"))
    p = pip("wheel", "--no-deps", "-w", str(local), *[str(f) for f in sd.iterdir()])
    shutil.rmtree(sd)
    new = set(local.glob("*.whl")) - before
    if p.returncode or not new:
        raise SystemExit(f"error: building a wheel for {req} failed:\n{p.stderr[-2000:]}")
    for w in new:
        if not w.name.endswith("-none-any.whl"):
            raise SystemExit(f"error: {req} builds a platform wheel here ({w.name}), which would not fit the "
                             "target: build it on a machine of the target's platform and Python")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()


def pack(files: list[Path], out: Path, cap_mib: float) -> list[str]:
    """Chunk folders c1, c2, ... of at most cap_mib MiB, largest files first, a file that does not fit in
    the room left split into .partNN pieces; returns manifest lines: name, size, sha256, parts."""
    cap = int(cap_mib * MIB)
    if cap < 2 * MIN_PIECE:
        raise SystemExit(f"error: --chunk-mib {cap_mib} is too small (at least {2 * MIN_PIECE // MIB})")
    chunk, used, lines = 1, 0, []
    (out / "c1").mkdir(parents=True)
    for path in sorted(files, key=lambda f: (-f.stat().st_size, f.name)):
        size, parts, idx = path.stat().st_size, [], 0
        with open(path, "rb") as fin:
            left = size
            while left > 0 or not parts:
                room = cap - used
                if room < min(left, MIN_PIECE):
                    chunk, used, room = chunk + 1, 0, cap
                    (out / f"c{chunk}").mkdir()
                whole = left <= room and idx == 0
                name = path.name if whole else f"{path.name}.part{idx:02d}"
                n = left if whole else min(left, room)
                with open(out / f"c{chunk}" / name, "wb") as fo:
                    fo.write(fin.read(n))
                parts.append(f"c{chunk}/{name}")
                used, left, idx = used + n, left - n, idx + 1
        lines.append(f"{path.name}\t{size}\t{sha256(path)}\t{','.join(parts)}")
    return lines


def selection(extras: list[str], no_serve: bool, only_serve: bool, carry: list[str]
              ) -> tuple[list[str], list[tuple[str, str | None]]]:
    """What to collect and what to skip: the project (its extras) and `vllm serve`'s part, less the image; with
    only_serve, `vllm serve`'s part alone, less the image and the vLLM bundle it is installed beside."""
    if only_serve and no_serve:
        raise SystemExit("error: --only-vllm-serve and --no-vllm-serve leave nothing to collect")
    serve = [] if no_serve else read_list(HERE / "vllm_serve.txt")
    reqs = serve if only_serve else project_requirements(extras) + serve
    skips = image_skips(read_list(HERE / "gpu_image.txt"), carry)
    if only_serve:  # the bundle's own wheels are installed beside these (same folder) already
        skips += image_skips(read_list(HERE / "vllm_bundle.txt"), carry)
    return reqs, skips


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    ap.add_argument("--python", default="3.12", help="target CPython version")
    ap.add_argument("--platform", default="manylinux_2_28_x86_64", help="target platform tag")
    ap.add_argument("--extras", default="ray,slurm,postgres", help="the project's extras to carry (comma list)")
    ap.add_argument("--no-vllm-serve", action="store_true", help="leave out what `vllm serve` needs")
    ap.add_argument("--only-vllm-serve", action="store_true",
                    help="only what `vllm serve` needs beyond the vLLM bundle and the image (no project wheels)")
    ap.add_argument("--carry", action="append", default=[], help="carry this package even if the image has it")
    ap.add_argument("--chunk-mib", type=float, default=56.0, help="the most one chunk folder may hold")
    a = ap.parse_args(argv)
    extras = [e for e in a.extras.split(",") if e]
    reqs, skips = selection(extras, a.no_vllm_serve, a.only_vllm_serve, a.carry)
    plat = platform_args(a.python, a.platform)
    if a.out.exists():
        shutil.rmtree(a.out)
    wheels = a.out / "wheels"
    wheels.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        work, local = Path(tmp), Path(tmp) / "local"
        local.mkdir()
        print(f"resolving {len(reqs)} requirements for CPython {a.python} on {a.platform} ...", flush=True)
        closure = resolve(reqs, read_list(HERE / "vllm_bundle.txt"), plat, local, work)
        carried, skipped = [], []
        for m in closure:
            s = skipped_by(m["name"], skips)
            (skipped if s else carried).append((m["name"], m["version"], s[1] if s else None))
        print(f"downloading {len(carried)} wheels (skipping {len(skipped)} the image brings) ...", flush=True)
        p = pip("download", "--no-deps", "--progress-bar", "on", "-d", str(wheels), "--find-links", str(local),
                *plat, *[f"{n}=={v}" for n, v, _ in carried])  # one pip for all: its start-up is most of the cost
        if p.returncode:
            raise SystemExit(f"error: downloading the wheels failed:\n{p.stderr[-2000:]}")
    files = sorted(wheels.glob("*.whl"))
    lines = pack(files, a.out, a.chunk_mib)
    shutil.rmtree(wheels)
    (a.out / "manifest.tsv").write_text("\n".join(lines) + "\n")
    (a.out / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v, _ in carried))
    (a.out / "skipped.txt").write_text("# on the GPU image (deploy/gpu_image.txt)"
                                       + (" or in the vLLM bundle (deploy/vllm_bundle.txt)" if a.only_vllm_serve
                                          else "")
                                       + ": name, the version pip chose here, the image's (bundle's) version "
                                       "where known\n" + "".join(
                                           f"{n}\t{v}\t{iv or '?'}\n" for n, v, iv in sorted(skipped)))
    shutil.copy(HERE / "install.py", a.out / "install.py")
    total = sum(f.stat().st_size for f in a.out.glob("c*/*"))
    chunks = sorted(a.out.glob("c[0-9]*"), key=lambda c: int(c.name[1:]))
    print(f"wheelhouse: {len(carried)} wheels, {total / MIB:.1f} MiB in {len(chunks)} chunk(s) of <= "
          f"{a.chunk_mib:g} MiB ({', '.join(c.name for c in chunks)}); skipped {len(skipped)} the image brings "
          f"{' or the vLLM bundle' if a.only_vllm_serve else ''} (skipped.txt). On the GPU host: "
          f"python3 install.py --target DIR (or --venv DIR)")


if __name__ == "__main__":
    main()
