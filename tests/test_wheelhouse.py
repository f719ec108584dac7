"""The air-gapped install: a wheelhouse split into chunks, carried over in several transfers, put back
together and installed with --no-index; a sha256 that differs refuses, a missing wheel is named."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deploy.wheelhouse import image_skips, pack, platform_args, selection, skipped_by

pytestmark = pytest.mark.e2e  # processes of their own: the command, a server, a shell script

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "deploy" / "install.py"


def make_wheel(d: Path, name: str, requires: tuple[str, ...] = (), payload: int = 0) -> Path:
    path = d / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}/__init__.py", "VERSION = '1.0'\n")
        z.writestr(f"{name}/blob.bin", os.urandom(payload))  # incompressible: the wheel is this big
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def wheelhouse(tmp: Path, requires_a: tuple[str, ...] = ("whb",)) -> Path:
    src, house = tmp / "src", tmp / "house"
    src.mkdir()
    files = [make_wheel(src, "wha", requires_a, payload=3 << 20), make_wheel(src, "whb")]
    house.mkdir()
    lines = pack(files, house, cap_mib=2)
    (house / "manifest.tsv").write_text("\n".join(lines) + "\n")
    (house / "requirements.txt").write_text("wha==1.0\nwhb==1.0\n")
    return house


def install(house: Path, stage: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(INSTALL), "--from", str(house), "--stage-dir", str(stage), *args],
                          capture_output=True, text=True, timeout=300)


def test_chunks_from_two_transfers_install_into_a_target(tmp_path):
    house = wheelhouse(tmp_path)
    chunks = sorted(p.name for p in house.glob("c*"))
    assert len(chunks) >= 2  # 3 MiB + a small wheel in chunks of at most 2 MiB
    assert all(sum(f.stat().st_size for f in (house / c).iterdir()) <= 2 << 20 for c in chunks)
    first, second = tmp_path / "t1", tmp_path / "t2"  # what each transfer carries
    first.mkdir(), second.mkdir()
    (house / "c1").rename(first / "c1")
    for p in house.iterdir():
        p.rename(second / p.name)
    stage = tmp_path / "stage"
    assert install(first, stage, "--stage").returncode == 0
    p = install(second, stage, "--target", str(tmp_path / "site"))
    assert p.returncode == 0, p.stderr
    out = subprocess.run([sys.executable, "-c", "import wha, whb; print(wha.VERSION, whb.VERSION)"],
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, capture_output=True, text=True)
    assert out.stdout.split() == ["1.0", "1.0"]


def test_a_sha256_that_differs_refuses_everything(tmp_path):
    house = wheelhouse(tmp_path)
    part = next(house.glob("c*/whb*"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed on the way
    part.write_bytes(bytes(data))
    p = install(house, tmp_path / "stage", "--target", str(tmp_path / "site"))
    assert p.returncode == 1 and "sha256 mismatch" in p.stderr and "whb-1.0-py3-none-any.whl" in p.stderr
    assert not (tmp_path / "site").exists()  # nothing installed


def test_a_missing_chunk_or_dependency_is_named(tmp_path):
    house = wheelhouse(tmp_path, requires_a=("whb", "whc>=2"))
    p = install(house, tmp_path / "stage", "--target", str(tmp_path / "site"))
    assert p.returncode == 1 and "whc (needed by wha)" in p.stderr  # neither in the house nor here
    for f in house.glob("c*/wha*part01"):
        f.unlink()
    p = install(house, tmp_path / "stage2", "--target", str(tmp_path / "site2"))
    assert p.returncode == 1 and "wha-1.0-py3-none-any.whl (part c" in p.stderr and "did not arrive" in p.stderr


def test_a_venv_install_names_a_wheel_the_house_lacks(tmp_path):
    house = wheelhouse(tmp_path)
    (house / "requirements.txt").write_text("wha==1.0\nwhb==1.0\nwhd==1.0\n")
    p = install(house, tmp_path / "stage", "--venv", str(tmp_path / "venv"))
    assert p.returncode == 1 and "missing wheel(s)" in p.stderr and "whd==1.0" in p.stderr


def test_the_image_skip_list_and_target_platform():
    skips = image_skips(["torch==2.11.0", "nvidia-*", "numpy"], carry=["numpy"])
    assert skipped_by("nvidia-cublas", skips) == ("nvidia-*", None) and skipped_by("Torch", skips)[1] == "2.11.0"
    assert skipped_by("numpy", skips) is None  # --carry wins over the image
    args = platform_args("3.12", "manylinux_2_28_x86_64")
    assert args[args.index("--python-version") + 1] == "3.12" and "manylinux2014_x86_64" in args


def test_the_vllm_serve_part_alone_skips_the_bundle_and_the_project():
    reqs, skips = selection([], no_serve=False, only_serve=True, carry=[])
    assert "uvicorn" in reqs and not any(r.startswith(("hydra-core", "mlflow")) for r in reqs)
    assert skipped_by("pydantic", skips) is not None  # the bundle brings it
    assert skipped_by("torch", skips) is not None  # the image brings it
    full, full_skips = selection([], no_serve=False, only_serve=False, carry=[])
    assert "uvicorn" in full and any(r.startswith("hydra-core") for r in full)
    assert skipped_by("pydantic", full_skips) is None  # the project's wheelhouse carries its own
    assert "uvicorn" not in selection([], no_serve=True, only_serve=False, carry=[])[0]
    with pytest.raises(SystemExit, match="nothing to collect"):
        selection([], no_serve=True, only_serve=True, carry=[])
