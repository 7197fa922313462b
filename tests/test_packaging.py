"""Packaging: an sdist and the wheel built from it carry every file the fused kernels need.

``package-data`` named ``*.cpp`` only, so a wheel had none of csrc's headers and,
installed from it, ``linattn build`` stopped at ``fatal error: blas.h``. Here the source tree is
copied, an sdist built from the copy, a wheel from the sdist, the wheel installed into a fresh
virtual environment (torch, numpy and scipy from the system's site-packages: nothing downloaded) and
``linattn build`` run there from outside the clone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from linattn.ops import _native

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "src" / "linattn" / "ops" / "csrc"
# Every file a build of the kernels reads, relative to the package: linattn/ops/csrc/...
KERNEL_FILES = sorted(str(p.relative_to(CSRC.parents[2])) for p in _native.FILES)


def run(*args: str | Path, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """args run to completion; its output is in the assertion message when it fails."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def copy_project(to: Path) -> Path:
    """The files an sdist is built from (pyproject, setup.py, README, LICENSE, src/), without
    build output."""
    to.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, to / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc", "_kernels*.so")
    shutil.copytree(ROOT / "src", to / "src", ignore=skip)
    return to


def see_site_packages(python: Path) -> None:
    """The new environment of ``python`` sees this interpreter's site-packages (torch, numpy and
    scipy), listed in a .pth file after its own: ``--system-site-packages`` reaches only the base
    interpreter's, which lack torch when the tests run in a virtual environment (the README's
    setup). Paths a .pth file lists are not scanned for .pth files themselves, so this tree's
    editable install of linattn stays out of sight."""
    import site

    done = run(python, "-c", "import site; print(site.getsitepackages()[0])", cwd=python.parent)
    own = Path(done.stdout.strip())
    (own / "parent-site-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")


def build_sdist_and_wheel(tmp: Path) -> tuple[Path, Path]:
    """An sdist of a copy of the tree, and the wheel pip builds from that sdist."""
    project, dist = copy_project(tmp / "project"), tmp / "dist"
    script = "import sys; from setuptools import build_meta as b; b.build_sdist(sys.argv[1])"
    run(sys.executable, "-c", script, dist, cwd=project)
    (sdist,) = dist.glob("linattn-*.tar.gz")
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    run(*pip, sdist, "-w", dist, cwd=tmp)
    (wheel,) = dist.glob("linattn-*.whl")
    return sdist, wheel


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without PYTHONPATH (the installed wheel, not this tree)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LINATTN_NATIVE")}
    return {**env, **extra}


@pytest.mark.slow
def test_a_wheel_from_the_sdist_installs_and_builds_the_kernels(tmp_path):
    sdist, wheel = build_sdist_and_wheel(tmp_path)
    in_sdist = {n.split("/src/", 1)[1] for n in tarfile.open(sdist).getnames() if "/src/" in n}
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert not set(KERNEL_FILES) - in_sdist, "the sdist lacks kernel files"
    assert not set(KERNEL_FILES) - in_wheel, "the wheel lacks kernel files"

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--system-site-packages", venv, cwd=tmp_path)
    python, linattn = venv / "bin" / "python", venv / "bin" / "linattn"
    see_site_packages(python)
    install = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall"]
    run(*install, wheel, cwd=tmp_path)
    env = clean_env(TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"))
    where = run(python, "-c", "import linattn; print(linattn.__file__)", cwd=tmp_path, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # not this tree's
    built = run(linattn, "build", cwd=tmp_path, env=env)
    assert "the fused CPU chunk kernels are ready" in built.stdout, built.stdout
