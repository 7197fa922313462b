"""The fused kernels' one-time compile never hangs (issue 18, defect 7).

A process killed during the compile left torch's compile lock (the file ``lock`` in the build
directory) behind, and from then on the first float32 chunk call of every process waited for it
without end. Each case runs a fresh Python process on a copy of this session's build (or, under
``-m slow``, on a real compile killed midway) with a timeout: it must finish, say what it did on
stderr, and compute the right answer, with the fused kernels or, after a bounded wait for another
process's compile, with the PyTorch loop and a warning.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import linattn
from linattn.ops import _native

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)

# The first float32 chunk call of a fresh process: whether it ran fused, and its error.
CHILD = """
import torch
from linattn.ops import _native, linear_attention
q = torch.randn(1, 8, 2, 4, generator=torch.Generator().manual_seed(0))
o, _ = linear_attention(q, q, q)
o64, _ = linear_attention(q.double(), q.double(), q.double(), mode="recurrent")
print(_native.ready(), float((o.double() - o64).abs().max()))
"""


def _child(extensions: Path, timeout: float, **env: str) -> tuple[int, str, str, float]:
    """Run CHILD with its own TORCH_EXTENSIONS_DIR; (return code, stdout, stderr, seconds)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("LINATTN_NATIVE", "PYTHONPATH")}
    environ.update(
        PYTHONPATH=str(Path(linattn.__file__).parents[1]),
        TORCH_EXTENSIONS_DIR=str(extensions),
        OMP_NUM_THREADS="1",
        **env,
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=environ, capture_output=True, text=True, timeout=timeout
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def _cached_build(tmp_path: Path) -> Path:
    """A TORCH_EXTENSIONS_DIR holding a copy of this session's build (times kept: up to date)."""
    from torch.utils import cpp_extension

    extensions = tmp_path / "extensions"
    built = Path(cpp_extension._get_build_directory(_native.build_name(), verbose=False))
    shutil.copytree(built, extensions / built.name, ignore=shutil.ignore_patterns("*lock"))
    return extensions


def _fused_and_right(stdout: str) -> tuple[bool, float]:
    fused, error = stdout.split()
    return fused == "True", float(error)


@needs_native
def test_a_stale_compile_lock_does_not_hang_the_next_call(tmp_path):
    extensions = _cached_build(tmp_path)
    baton = extensions / _native.build_name() / "lock"
    baton.touch()  # what a process killed during the compile leaves behind
    code, out, err, _ = _child(extensions, timeout=60)
    assert code == 0, err
    assert f"removed a stale compile lock, {baton}, left by an interrupted build" in err
    assert not baton.exists()
    fused, error = _fused_and_right(out)
    assert fused and error < 1e-5


@needs_native
def test_a_compile_held_too_long_falls_back_to_the_loop_with_a_warning(tmp_path):
    # A live process compiling holds linattn.lock (and torch's lock): the next process waits
    # LINATTN_BUILD_TIMEOUT seconds, then runs the PyTorch loop, with a warning saying why.
    extensions = _cached_build(tmp_path)
    directory = extensions / _native.build_name()
    fd = os.open(directory / "linattn.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (directory / "lock").touch()
        code, out, err, seconds = _child(extensions, timeout=60, LINATTN_BUILD_TIMEOUT="1")
    finally:
        os.close(fd)
    assert code == 0, err
    assert "waiting for another process's compile (at most 1 s)" in err
    assert "RuntimeWarning: linattn: the fused CPU chunk forward is unavailable (not built:" in err
    assert "another process held the compile lock" in err and "LINATTN_BUILD_TIMEOUT" in err
    fused, error = _fused_and_right(out)
    assert not fused and error < 1e-5
    assert seconds < 60  # one second of waiting, plus starting Python and torch


@needs_native
def test_the_compile_is_announced_on_stderr(tmp_path, monkeypatch, capsys):
    # No build in the directory yet: the message comes before the compile and after it. (The
    # compile itself is replaced: this process has the extension loaded already.)
    from torch.utils import cpp_extension

    calls = []
    module = types.SimpleNamespace(fast_step=print)  # the Python module a build returns
    monkeypatch.setattr(_native, "build_directory", lambda: tmp_path)
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: calls.append(kw) or module)
    how, step = _native._compile_and_load(1.0)
    assert how.startswith("compiled in ") and step is print
    err = capsys.readouterr().err
    assert "linattn: compiling the fused CPU chunk kernels (csrc/, " in err and "once; " in err
    assert "this may take a minute or two" in err and "linattn: compiled in " in err
    assert calls[0]["build_directory"] == str(tmp_path)
    # A build newer than the source: loaded, nothing said.
    (tmp_path / f"{_native.build_name()}.so").touch()
    assert _native._compile_and_load(1.0) == ("loaded from the build cache", print)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_build_timeout_is_named(value, monkeypatch):
    monkeypatch.setenv("LINATTN_BUILD_TIMEOUT", value)
    with pytest.raises(ValueError, match="LINATTN_BUILD_TIMEOUT must be"):
        _native.build_timeout()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_a_compile_killed_midway_does_not_hang_the_next_call(tmp_path):
    # The real thing: a compile from scratch, killed (with its compiler) once torch's lock exists.
    extensions = tmp_path / "extensions"
    baton = extensions / _native.build_name() / "lock"
    environ = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions), OMP_NUM_THREADS="1")
    environ.update(PYTHONPATH=str(Path(linattn.__file__).parents[1]))
    environ.pop("LINATTN_NATIVE", None)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=environ,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not baton.exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.1)
    time.sleep(2)  # the compiler is running
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert baton.exists()
    code, out, err, _ = _child(extensions, timeout=400)
    assert code == 0, err
    assert "removed a stale compile lock" in err and "may take a minute or two" in err
    fused, error = _fused_and_right(out)
    assert fused and error < 1e-5


def test_the_tuning_constants_are_compiled_in_and_name_the_build(monkeypatch):
    # Each C++ tuning constant comes from ops/tuning.py as a -D define (csrc/tuning.h refuses to
    # compile without them), and the flags are part of the build's name: a changed value builds
    # anew instead of loading a build made with the old one.
    from linattn.ops import tuning

    assert _native.DEFINES == {
        "LINATTN_MAX_CHUNK": tuning.MAX_CHUNK,
        "LINATTN_HUGE_MIN_BYTES": tuning.HUGE_MIN_BYTES,
        "LINATTN_CACHE_MIB": tuning.CACHE_MIB,
        "LINATTN_STEP_GRAIN": tuning.STEP_GRAIN,
        "LINATTN_SPLIT_IMBALANCE": tuning.SPLIT_IMBALANCE,
    }
    for name, value in _native.DEFINES.items():
        assert f"-D{name}={value}" in _native.FLAGS
    before = _native.build_name()
    flags = [f.replace(f"={tuning.MAX_CHUNK}", "=4096") for f in _native.FLAGS]
    monkeypatch.setattr(_native, "FLAGS", flags)
    assert _native.build_name() != before


def test_every_source_and_header_is_compiled_or_tracked():
    # csrc/ and its subfolders (csrc/rules/: a file per update rule).
    csrc = Path(_native.__file__).with_name("csrc")
    assert set(_native.SOURCES) == set(csrc.rglob("*.cpp")) and len(_native.SOURCES) > 1
    assert {csrc / "rules" / "additive.cpp", csrc / "rules" / "delta.cpp"} <= set(_native.SOURCES)
    assert set(_native.FILES) == set(csrc.rglob("*.cpp")) | set(csrc.rglob("*.h"))
    # torch's build names each object file after its source's name alone: no two may share one.
    assert len({path.name for path in _native.SOURCES}) == len(_native.SOURCES)


def test_every_source_and_header_is_packaged():
    # pyproject's package-data ships what the lazy build compiles: every source and header.
    import ast
    import fnmatch

    package = Path(_native.__file__).parents[1]
    pyproject = package.parents[1] / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("not a source checkout")
    text = pyproject.read_text().split("[tool.setuptools.package-data]", 1)[1]
    patterns = ast.literal_eval(text.split("linattn = ", 1)[1].splitlines()[0])
    for path in _native.FILES:
        name = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(name, p) and name.count("/") == p.count("/") for p in patterns)


def test_a_header_newer_than_the_build_compiles_again(tmp_path, monkeypatch):
    source, header = tmp_path / "a.cpp", tmp_path / "a.h"
    source.touch()
    header.touch()
    built = tmp_path / f"{_native.build_name()}.so"
    built.touch()
    old = time.time() - 100
    os.utime(source, (old, old))
    os.utime(header, (old, old))
    monkeypatch.setattr(_native, "FILES", [source, header])
    assert not _native._compiles(tmp_path, _native.build_name())
    os.utime(header, None)  # now: newer than the build
    os.utime(built, (old + 1, old + 1))
    assert _native._compiles(tmp_path, _native.build_name())


def test_a_short_wait_for_the_lock_is_not_announced(tmp_path, capsys):
    # Another process loading a cached build holds the lock a fraction of a second: no line
    # (a sweep's workers start together); a wait past the grace period is announced.
    import threading

    def hold(seconds: float) -> threading.Thread:
        fd = os.open(tmp_path / _native.LOCK_NAME, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        thread = threading.Thread(target=lambda: (time.sleep(seconds), os.close(fd)))
        thread.start()
        return thread

    thread = hold(0.3)
    with _native.compile_lock(tmp_path, timeout=60):
        pass
    thread.join()
    assert capsys.readouterr().err == ""
    thread = hold(_native.WAIT_GRACE_S + 0.5)
    with _native.compile_lock(tmp_path, timeout=60):
        pass
    thread.join()
    assert "waiting for another process's compile (at most 60 s)" in capsys.readouterr().err
