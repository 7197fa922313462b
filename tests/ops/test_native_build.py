"""Where the fused kernels come from, and a just-in-time build that never hangs or collides.

The installed binary records what it was built from (``_buildinfo``) and is loaded only where that
fits. In a source tree a missing or stale binary is compiled once, into a folder named by a hash of
the sources and flags, under a lock its holder names itself in (pid and start time): another
process waits for it, saying for whom and how long, and never takes it over. Each case that starts
a process runs a fresh Python on a copy of this session's binary (or, under ``-m slow``, on a real
compile killed midway) with a timeout: it must finish, say what it did on stderr, and compute the
right answer, with the fused kernels or, after a bounded wait, with the PyTorch loop and a warning.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

import linattn
from linattn.ops import _buildinfo, _native

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)

# The first float32 chunk call of a fresh process that ignores the installed binary (the
# just-in-time build's path): whether it ran fused, and its error.
CHILD = """
import torch
from linattn.ops import _native, linear_attention
_native.installed_binary = lambda: None
q = torch.randn(1, 8, 2, 4, generator=torch.Generator().manual_seed(0))
o, _ = linear_attention(q, q, q)
o64, _ = linear_attention(q.double(), q.double(), q.double(), mode="recurrent")
print(_native.ready(), float((o.double() - o64).abs().max()))
"""


def _environ(extensions: Path, **env: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("LINATTN_NATIVE", "PYTHONPATH")}
    environ.update(
        PYTHONPATH=str(Path(linattn.__file__).parents[1]),
        TORCH_EXTENSIONS_DIR=str(extensions),
        OMP_NUM_THREADS="1",
        **env,
    )
    return environ


def _child(extensions: Path, timeout: float, **env: str) -> tuple[int, str, str, float]:
    """Run CHILD with its own TORCH_EXTENSIONS_DIR; (return code, stdout, stderr, seconds)."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=_environ(extensions, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def _finish_build(directory: Path) -> None:
    """Put a finished just-in-time build in ``directory``: a copy of this session's binary (the
    same sources, torch and processor, so it fits) and the mark a finished build leaves."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy2(_native.location(), directory / f"{_native.MODULE}.so")
    (directory / _native.DONE_NAME).write_text("done\n")


def _fused_and_right(stdout: str) -> tuple[bool, float]:
    fused, error = stdout.split()
    return fused == "True", float(error)


def _hold(path: Path) -> int:
    """Take the lock at ``path`` as a compiling process does (flock, then its record)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    record = f"pid={os.getpid()} start={_native.process_start(os.getpid())} since={time.time()}"
    os.pwrite(fd, record.encode(), 0)
    return fd


@needs_native
def test_a_finished_build_in_the_cache_is_loaded_without_a_compile(tmp_path):
    extensions = tmp_path / "extensions"
    _finish_build(extensions / _native.build_name())
    code, out, err, _ = _child(extensions, timeout=120)
    assert code == 0, err
    assert "compiling" not in err and "waiting" not in err
    fused, error = _fused_and_right(out)
    assert fused and error < 1e-5


@needs_native
def test_a_waiting_process_names_the_holder_and_loads_its_build(tmp_path):
    # One process compiles (here: this one holds the lock, then leaves a finished build); the
    # other waits, saying for which process and how long, and then loads that build: neither
    # times out, and the lock is never taken from its live holder.
    extensions = tmp_path / "extensions"
    directory = extensions / _native.build_name()
    directory.mkdir(parents=True)
    fd = _hold(directory / _native.LOCK_NAME)
    environ = _environ(extensions)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    lines: list[str] = []  # the child's stderr, read as it comes
    reader = threading.Thread(target=lambda: lines.extend(iter(child.stderr.readline, b"")))
    reader.start()
    try:
        # The child starts (torch: seconds, more on a loaded machine) and waits: the build is
        # finished only once it has said so, however long its start took.
        deadline = time.monotonic() + 120
        while not any(b"waiting for process" in line for line in lines):
            assert child.poll() is None and time.monotonic() < deadline, b"".join(lines)
            time.sleep(0.2)
        _finish_build(directory)
    finally:
        os.close(fd)
    out = child.communicate(timeout=120)[0].decode()
    reader.join()
    err = b"".join(lines).decode()
    assert child.returncode == 0, err
    assert f"waiting for process {os.getpid()} (alive; holding it since " in err
    assert "while it compiles the fused CPU kernels: " in err and " s so far, at most 1200 s" in err
    assert "compiling" not in err and "stale" not in err
    fused, error = _fused_and_right(out)
    assert fused and error < 1e-5


@needs_native
def test_a_compile_held_too_long_falls_back_to_the_loop_with_a_warning(tmp_path):
    # A live process compiling holds linattn.lock (and torch's lock): the next process waits
    # LINATTN_BUILD_TIMEOUT seconds, then runs the PyTorch loop, with a warning saying why.
    extensions = tmp_path / "extensions"
    directory = extensions / _native.build_name()
    directory.mkdir(parents=True)
    fd = _hold(directory / _native.LOCK_NAME)
    try:
        (directory / "lock").touch()
        code, out, err, seconds = _child(extensions, timeout=60, LINATTN_BUILD_TIMEOUT="1")
        assert (directory / "lock").exists()  # the holder's: not removed
    finally:
        os.close(fd)
    assert code == 0, err
    assert f"waiting for process {os.getpid()} (alive; " in err and "at most 1 s" in err
    assert "RuntimeWarning: linattn: the fused CPU chunk forward is unavailable (not built:" in err
    assert f"process {os.getpid()} (alive; " in err and "LINATTN_BUILD_TIMEOUT" in err
    fused, error = _fused_and_right(out)
    assert not fused and error < 1e-5
    assert seconds < 60  # one second of waiting, plus starting Python and torch


def test_a_stale_torch_lock_is_removed_under_the_lock(tmp_path, capsys):
    # torch's compile lock (the file ``lock``) left by a compile killed midway: whoever holds
    # linattn.lock removes it, since its maker cannot be alive (it held linattn.lock).
    (tmp_path / "lock").touch()
    with _native.compile_lock(tmp_path, timeout=5):
        record = (tmp_path / _native.LOCK_NAME).read_text()
    assert not (tmp_path / "lock").exists()
    err = capsys.readouterr().err
    assert f"removed a stale compile lock, {tmp_path / 'lock'}, left by an interrupted build" in err
    assert f"pid={os.getpid()} start={_native.process_start(os.getpid())} " in record


def test_the_holder_is_named_by_pid_and_start_time(tmp_path):
    fd = os.open(tmp_path / "record", os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, f"pid={os.getpid()} start={_native.process_start(os.getpid())}".encode(), 0)
        assert _native._holder(fd).startswith(f"process {os.getpid()} (alive; ")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} start=1".encode(), 0)  # the pid reused: not the holder
        assert "(not seen here" in _native._holder(fd)
        os.ftruncate(fd, 0)
        assert _native._holder(fd) == "another process"  # locked, its record not yet written
    finally:
        os.close(fd)


def test_the_compile_is_announced_on_stderr(tmp_path, monkeypatch, capsys):
    # No build in the directory yet: the message comes before the compile and after it. (The
    # compile and the loading are replaced: this process may have the extension loaded already.)
    from torch.utils import cpp_extension

    calls = []
    module = types.SimpleNamespace(fast_step=print)  # the Python module a build returns
    monkeypatch.setattr(_native, "build_directory", lambda: tmp_path)
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: calls.append(kw) or module)
    monkeypatch.setattr(_native, "_import", lambda path: module)
    monkeypatch.setattr(torch.ops, "linattn_native", types.SimpleNamespace(chunk_forward=None))
    how, path, loaded = _native._compile_and_load(1.0, "no binary")
    assert how.startswith("compiled in ") and loaded is module
    err = capsys.readouterr().err
    assert "linattn: no binary: compiling the fused CPU kernels from csrc/ (" in err
    assert "once, 2-4 min on 2 cores" in err and "linattn: compiled in " in err
    assert calls[0]["build_directory"] == str(tmp_path) and calls[0]["name"] == "_kernels"
    generated = tmp_path / "build_info.cpp"
    assert str(generated) in calls[0]["sources"]
    assert f"source={_native.source_key()};torch={torch.__version__}" in generated.read_text()
    # Finished (its mark written) and fitting: loaded, nothing compiled, nothing said.
    assert (tmp_path / _native.DONE_NAME).is_file()
    monkeypatch.setattr(_native, "_cached", lambda directory: directory / "_kernels.so")
    how, _, loaded = _native._compile_and_load(1.0, "no binary")
    assert how.startswith("loaded from the build cache") and loaded is module
    assert capsys.readouterr().err == "" and len(calls) == 1


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
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=_environ(extensions),
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
    code, out, err, _ = _child(extensions, timeout=600)
    assert code == 0, err
    assert "removed a stale compile lock" in err and "2-4 min on 2 cores" in err
    fused, error = _fused_and_right(out)
    assert fused and error < 1e-5


def test_the_build_is_named_by_sources_flags_and_tuning(monkeypatch):
    # Each C++ tuning constant comes from ops/tuning.py as a -D define (csrc/tuning.h refuses to
    # compile without them); the flags and the sources are part of the build's name: a changed
    # value or source builds anew, and two trees of the same sources share one build.
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
    assert "-march=native" in _native.FLAGS
    before = _native.build_name()
    assert _native.build_name() == before  # the same code, the same name
    flags = [f.replace(f"={tuning.MAX_CHUNK}", "=4096") for f in _native.FLAGS]
    monkeypatch.setattr(_native, "FLAGS", flags)
    assert _native.build_name() != before
    monkeypatch.undo()
    monkeypatch.setitem(_native._keys, "source", "0" * 16)
    assert _native.build_name() != before


def test_the_source_key_follows_every_file(tmp_path, monkeypatch):
    assert _native.source_key() == _buildinfo.source_key(_native.FILES)
    monkeypatch.setattr(_buildinfo, "CSRC", tmp_path)
    source, header = tmp_path / "a.cpp", tmp_path / "a.h"
    source.write_text("int a;\n")
    header.write_text("// a\n")
    key = _buildinfo.source_key([source, header])
    assert _buildinfo.source_key([source, header]) == key
    header.write_text("// b\n")
    assert _buildinfo.source_key([source, header]) != key


def test_every_source_and_header_is_compiled_or_tracked():
    # csrc/ and its subfolders (csrc/rules/: a file per update rule).
    csrc = Path(_native.__file__).with_name("csrc")
    assert set(_native.SOURCES) == set(csrc.rglob("*.cpp")) and len(_native.SOURCES) > 1
    assert {csrc / "rules" / "additive.cpp", csrc / "rules" / "delta.cpp"} <= set(_native.SOURCES)
    assert set(_native.FILES) == set(csrc.rglob("*.cpp")) | set(csrc.rglob("*.h"))
    # torch's build names each object file after its source's name alone: no two may share one.
    names = [path.name for path in _native.SOURCES] + ["build_info.cpp"]  # + the generated one
    assert len(set(names)) == len(names)


def test_every_source_and_header_is_packaged():
    # pyproject's package-data ships the sources: the loader hashes them to check the binary,
    # and ``linattn build`` compiles them where it does not fit.
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


def test_a_short_wait_for_the_lock_is_not_announced(tmp_path, capsys):
    # Another process loading a cached build holds the lock a fraction of a second: no line
    # (a sweep's workers start together); a wait past the grace period is announced.
    def hold(seconds: float) -> threading.Thread:
        fd = _hold(tmp_path / _native.LOCK_NAME)
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
    err = capsys.readouterr().err
    assert f"waiting for process {os.getpid()} (alive; holding it since " in err
    assert " s so far, at most 60 s (LINATTN_BUILD_TIMEOUT)" in err
