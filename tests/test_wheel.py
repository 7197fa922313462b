"""The wheel carries the compiled kernels: installed where there is no compiler, they run at once.

``python -m build`` (without isolation: the kernels are compiled against the torch installed here)
makes an sdist and, from it, a wheel; the wheel is installed into a fresh virtual environment with
torch 2.13.0 (CPU) and run there with no compiler on PATH and an empty kernel cache. The first
``delta_rule`` call must run the fused kernels, the installed binary, in under 5 s, compiling
nothing. Then, the binary removed, the import says in one line that the PyTorch loop runs and how
to get the kernels. Minutes (a compile and an install): marked ``wheel``, run by ``.ci/run``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_CALL_S = 5.0

CHILD = """
import json, time
start = time.perf_counter()
import torch
from linattn.ops import _native, delta_rule
imported = time.perf_counter()
gen = torch.Generator().manual_seed(0)
B, T, H, K = 1, 256, 4, 64
q, k, v = (torch.randn(B, T, H, K, generator=gen) for _ in range(3))
k = torch.nn.functional.normalize(k, dim=-1)
beta = torch.rand(B, T, H, generator=gen)
begin = time.perf_counter()
o, _ = delta_rule(q, k, v, beta, mode="chunk")
first = time.perf_counter() - begin
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    delta_rule(q, k, v, beta, mode="chunk")
ops = sorted({e.key for e in prof.key_averages()})
o64, _ = delta_rule(q.double(), k.double(), v.double(), beta.double(), mode="recurrent")
print(json.dumps({
    "import_s": imported - start, "first_call_s": first, "ready": _native.ready(),
    "reason": _native.reason(), "location": str(_native.location()),
    "fused_ops": [name for name in ops if name.startswith("linattn_native::")],
    "error": float((o.double() - o64).abs().max()),
}))
"""


def run(*args: str | Path, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """args run to completion; its output is in the assertion message when it fails."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def copy_project(to: Path) -> Path:
    """What an sdist is built from (pyproject, setup.py, README, LICENSE, src/); no build output."""
    to.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, to / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc", "_kernels*.so")
    shutil.copytree(ROOT / "src", to / "src", ignore=skip)
    return to


@pytest.mark.wheel
def test_the_wheel_runs_its_kernels_without_a_compiler(tmp_path):
    project, dist = copy_project(tmp_path / "project"), tmp_path / "dist"
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LINATTN_NATIVE")}
    built = run(
        sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, project,
        cwd=tmp_path, env=environ,
    )  # fmt: skip
    assert "linattn: compiled the fused CPU kernels in " in built.stdout + built.stderr
    (wheel,) = dist.glob("linattn-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("linattn/ops/_kernels.")], names
    assert "linattn/ops/csrc/kernels.h" in names  # the sources: the loader checks the binary

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "torch==2.13.0", wheel, cwd=tmp_path, env=environ)

    extensions = tmp_path / "extensions"
    extensions.mkdir()
    bare = {k: v for k, v in environ.items() if k not in ("CXX", "CC")}
    bare.update(PATH=str(venv / "bin"), TORCH_EXTENSIONS_DIR=str(extensions))
    assert shutil.which("c++", path=bare["PATH"]) is None  # no compiler to be found
    done = run(python, "-c", CHILD, cwd=tmp_path, env=bare)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ready"] and result["reason"].startswith("installed, built for torch 2.13.0")
    assert Path(result["location"]).is_relative_to(venv), result
    assert "linattn_native::chunk_forward" in result["fused_ops"], result
    assert result["error"] < 1e-4, result
    assert result["first_call_s"] < FIRST_CALL_S, result
    assert "compil" not in done.stderr and list(extensions.iterdir()) == [], done.stderr
    print(f"wheel: import {result['import_s']:.2f} s, first call {result['first_call_s']:.3f} s")

    # Without the binary (and no compiler): one line at import, what runs and how to get them.
    Path(result["location"]).unlink()
    done = run(python, "-c", CHILD, cwd=tmp_path, env=bare)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["ready"] and result["fused_ops"] == [] and result["error"] < 1e-4
    lines = [line for line in done.stderr.splitlines() if line.startswith("linattn:")]
    assert lines == [
        "linattn: the fused CPU kernels are unavailable (no binary was built with this "
        "package, and no C++ compiler is found to build them): the PyTorch loop runs; "
        + lines[0].split("the PyTorch loop runs; ", 1)[1]
    ]
    assert "pip install --no-build-isolation" in lines[0] and "linattn build" in lines[0]
