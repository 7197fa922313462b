"""The fused CPU chunk form (``csrc/``), compiled on first use.

The op ``chunk_forward`` runs the chunk form's forward pass chunk by chunk in C++, every block of a
chunk in the cache, with the products on the BLAS that PyTorch links (the PyTorch group loop
spends most of its time moving group-sized tensors through memory, not multiplying). It is the
same algebra as the PyTorch chunk loop (``chunk``) and is checked against it and against float64 in
``tests/ops/test_native.py``. The op ``chunk_backward`` fuses the backward pass of every mechanism
of the mechanism table (docs/design.md) the same way, from the chunk states this forward saves
(``library`` calls both through ``kernel``). ``recurrent_step`` is the generation step with its
checks in one call.

The sources (``csrc/**/*.cpp`` and their headers; ``csrc/kernels.h`` says which file holds what) are
compiled together with ``torch.utils.cpp_extension`` the first time they are needed, with the
machine-tuned constants of ``tuning`` passed as ``-D`` defines (``DEFINES``; part of the build's
name, so a changed value builds anew). It takes a minute or so, said on stderr when it starts;
the build is cached under ``TORCH_EXTENSIONS_DIR``, by default ``~/.cache``, and ``linattn build``
does it ahead of time. It needs a C++ compiler; without one, or with ``LINATTN_NATIVE=0`` in the
environment, ``available()`` is False and the chunk form runs its PyTorch loop instead
(``reason()`` says why).

One process compiles at a time: it holds an ``fcntl.flock`` on ``linattn.lock`` in the build
directory, which the system releases when the process ends, however it ends. Under it, torch's own
compile lock (the file ``lock``, which a process killed mid-compile leaves behind and which made
every later first call wait for ever) is stale by construction and removed. Another process waits
for the lock at most ``LINATTN_BUILD_TIMEOUT`` seconds (default 300), then runs the PyTorch loop
with a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import platform
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from linattn.ops import tuning

CSRC = Path(__file__).with_name("csrc")
# Compiled together into one extension: csrc/ and its subfolders (csrc/rules/: a file per rule).
SOURCES = sorted(CSRC.rglob("*.cpp"))
FILES = sorted([*SOURCES, *CSRC.rglob("*.h")])  # everything a build depends on
# The machine-tuned constants of the kernels (``csrc/tuning.h`` checks that each is defined).
DEFINES = {
    "LINATTN_MAX_CHUNK": tuning.MAX_CHUNK,
    "LINATTN_HUGE_MIN_BYTES": tuning.HUGE_MIN_BYTES,
    "LINATTN_CACHE_MIB": tuning.CACHE_MIB,
    "LINATTN_STEP_GRAIN": tuning.STEP_GRAIN,
    "LINATTN_SPLIT_IMBALANCE": tuning.SPLIT_IMBALANCE,
}
# The C++ standard: cpp_extension's. -fopenmp: at::parallel_for is a header template whose
# ``#pragma omp parallel`` is compiled into the extension (PyTorch's OpenMP backend): without the
# flag the pragma is ignored and every "parallel" loop runs on the calling thread alone, and
# only the BLAS's own threads scale. No -fopenmp at the link (with it,
# a second load of the same build in one process aborted on a duplicate TORCH_LIBRARY): the
# extension's libgomp.so.1 is the one torch has loaded (one OpenMP runtime in the process).
FLAGS = [
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fopenmp-simd",
    *(f"-D{k}={v}" for k, v in DEFINES.items()),
]
LDFLAGS: list[str] = []

LOCK_NAME = "linattn.lock"  # our lock in the build directory (torch's own is ``lock``)
BUILD_TIMEOUT_S = 300.0  # the longest wait for another process's compile (LINATTN_BUILD_TIMEOUT)
WAIT_GRACE_S = 2.0  # how long a wait for the lock lasts before it is announced (compile_lock)

_state: dict[str, object] = {}
_load_lock = threading.Lock()  # one loading thread per process (flock is per open file)


def build_name() -> str:
    """The extension's name: one build per processor kind, PyTorch version and set of flags
    (the tuning constants among them), since it is compiled for the processor it is built on
    (``-march=native``) and against one PyTorch's headers (a cache directory shared by different
    machines keeps one build for each)."""
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                cpu += line
    except OSError:
        cpu += platform.processor()
    tag = hashlib.sha1(f"{cpu} {torch.__version__} {FLAGS}".encode()).hexdigest()[:10]
    return f"linattn_native_{tag}"


def build_timeout() -> float:
    """Seconds to wait for another process's compile: ``LINATTN_BUILD_TIMEOUT`` or 300."""
    text = os.environ.get("LINATTN_BUILD_TIMEOUT", "")
    try:
        value = float(text) if text else BUILD_TIMEOUT_S
    except ValueError:
        raise ValueError(
            f"LINATTN_BUILD_TIMEOUT must be a number of seconds, got {text!r}"
        ) from None
    if not value >= 0:  # NaN too
        raise ValueError(f"LINATTN_BUILD_TIMEOUT must be >= 0, got {text!r}")
    return value


def build_directory() -> Path:
    """Where the extension is built and cached (``torch.utils.cpp_extension``'s directory for it:
    under ``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``); created if needed."""
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(build_name(), verbose=False))


def _say(message: str) -> None:
    print(f"linattn: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def compile_lock(directory: Path, timeout: float) -> Iterator[None]:
    """Hold the build directory's ``linattn.lock`` (an exclusive ``flock``, released by the
    system when this process ends, however it ends), waiting at most ``timeout`` seconds for
    another process that holds it; then ``TimeoutError``. Under it, a torch compile lock (the
    file ``lock``) is stale, left by a killed compile, and removed. Without ``fcntl`` (Windows),
    torch's lock alone, as before.

    The wait is announced only once it has lasted ``WAIT_GRACE_S`` (or half the timeout): a
    process that loads a cached build holds the lock for a fraction of a second,
    and processes started together (a sweep's workers) should not each print a line for that."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        start, told = time.monotonic(), False
        deadline, announce = start + timeout, start + min(WAIT_GRACE_S, timeout / 2)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"another process held the compile lock {path} for {timeout:g} s "
                        "(LINATTN_BUILD_TIMEOUT)"
                    ) from None
                if not told and time.monotonic() >= announce:
                    _say(f"waiting for another process's compile (at most {timeout:g} s) ...")
                    told = True
                time.sleep(0.1)
        baton = directory / "lock"
        if baton.exists():
            baton.unlink(missing_ok=True)
            _say(f"removed a stale compile lock, {baton}, left by an interrupted build")
        yield
    finally:
        os.close(fd)  # releases the flock


def _compiles(directory: Path, name: str) -> bool:
    """Whether loading will compile: no build yet, or one older than a source or header."""
    built = directory / f"{name}.so"
    newest = max(path.stat().st_mtime for path in FILES)
    return not built.exists() or built.stat().st_mtime < newest


def _compile_and_load(timeout: float) -> tuple[str, Callable[..., Tensor]]:
    """Compile (or find in the cache) and load the extension under ``compile_lock``; how, and
    the step bound directly (``fast_step``)."""
    from torch.utils import cpp_extension

    name, directory = build_name(), build_directory()
    with compile_lock(directory, timeout):
        compiles = _compiles(directory, name)
        if compiles:
            _say(
                f"compiling the fused CPU chunk kernels (csrc/, {len(SOURCES)} files), once; "
                f"this may take a minute or two (cached in {directory}) ..."
            )
        start = time.monotonic()
        module = cpp_extension.load(
            name=name,
            sources=[str(path) for path in SOURCES],
            extra_cflags=FLAGS,
            extra_ldflags=LDFLAGS,
            build_directory=str(directory),
            is_python_module=True,  # csrc/python.cpp; the ops register on loading too
            verbose=False,
        )
        seconds = time.monotonic() - start
    torch.ops.linattn_native.chunk_forward  # noqa: B018 (the op is registered)
    if compiles:
        _say(f"compiled in {seconds:.0f} s")
        return f"compiled in {seconds:.0f} s", module.fast_step
    return "loaded from the build cache", module.fast_step


def _load() -> None:
    """Compile (or find in the cache) and load the extension once; record why not otherwise."""
    if "ok" in _state:
        return
    timeout = build_timeout()  # a bad LINATTN_BUILD_TIMEOUT raises, naming it
    with _load_lock:
        if "ok" in _state:
            return
        try:
            how, step = _compile_and_load(timeout)
        except Exception as error:  # no compiler, a failed build, a lock held too long
            why = "not built" if isinstance(error, TimeoutError) else "build failed"
            _state.update(ok=False, reason=f"{why}: {type(error).__name__}: {error}")
            warnings.warn(
                f"linattn: the fused CPU chunk forward is unavailable ({_state['reason']}); "
                "the chunk form runs its PyTorch loop",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        _state.update(ok=True, reason=how, step=step)


def _environ_reader() -> Callable[[], bool]:
    """``os.environ.get("LINATTN_NATIVE", "1") != "0"`` as a function, read at every call.

    ``os.environ.get`` encodes the key and decodes the value on every call, a sizeable share of
    the Python around a decoding step. CPython's ``os.environ`` keeps the encoded pairs in a
    dict (``_data``, with ``encodekey`` / ``encodevalue``; every change made through
    ``os.environ`` lands there, as before), which is read directly where it has that form (a
    dict lookup, no encoding); elsewhere, ``os.environ.get``."""
    data = getattr(os.environ, "_data", None)
    try:
        key, zero = os.environ.encodekey("LINATTN_NATIVE"), os.environ.encodevalue("0")
    except (AttributeError, TypeError, ValueError):
        data = None
    if isinstance(data, dict):
        return lambda: data.get(key) != zero
    return lambda: os.environ.get("LINATTN_NATIVE", "1") != "0"


# False while ``LINATTN_NATIVE=0`` is set (read at every call, so it can be switched).
_enabled: Callable[[], bool] = _environ_reader()


def available() -> bool:
    """True when the fused code is enabled, compiled and loaded (it compiles on the first call;
    a disabled session never compiles it)."""
    if not _enabled():
        return False
    _load()
    return bool(_state["ok"])


def reason() -> str:
    """Why ``available()`` is what it is."""
    if not _enabled():
        return "disabled by LINATTN_NATIVE=0"
    _load()
    return str(_state["reason"])


def applies(q: Tensor) -> bool:
    """Whether the fused code serves q's inputs: float32 on the CPU, and it is available."""
    return q.device.type == "cpu" and q.dtype == torch.float32 and available()


def kernel(name: str):
    """The compiled op ``torch.ops.linattn_native.<name>`` (its schema in ``csrc/ops.cpp``); a
    clear error where the fused code is unavailable. ``library``'s kernels call
    ``chunk_forward`` and ``chunk_backward`` (internal layout as in ``chunk``, the
    mechanism as ``rule`` and ``gate``, any strides: the kernels check every shape and copy a
    layout their BLAS cannot read in place)."""
    if not available():
        raise RuntimeError(f"linattn: the fused CPU chunk form is unavailable ({reason()})")
    return getattr(torch.ops.linattn_native, name)


def fused(name: str):
    """``kernel(name)``'s default overload, for a caller that has just seen ``applies`` hold (the
    chunk ops' kernels, on every call): no second availability check, no overload resolution."""
    return getattr(torch.ops.linattn_native, name).default


def empty(sizes: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised tensor like ``like.new_empty(sizes)``; on the CPU, from 4 MiB up and with
    the extension loaded, in a block of the extension's cache (``BlockCache``,
    ``csrc/block_cache.cpp``: 2 MiB pages where Linux allows it, and a freed block kept for the
    next tensor of its size, so that its pages are not faulted in and zeroed again; see
    ``cache_release``)."""
    nbytes = math.prod(sizes) * like.element_size()
    if like.device.type == "cpu" and nbytes >= tuning.HUGE_MIN_BYTES and available():
        return kernel("empty_huge")(list(sizes), like.dtype)
    return like.new_empty(sizes)


def cache_release() -> int:
    """Return every block the extension's cache keeps to the system; the bytes returned (0 when
    the extension is not loaded: it never starts a build)."""
    return int(torch.ops.linattn_native.cache_release()) if ready() else 0


def cache_bytes() -> int:
    """Bytes of freed output blocks the extension's cache keeps for reuse (at most
    ``LINATTN_CACHE_MIB`` MiB, default ``tuning.CACHE_MIB``; 0 when the extension is not
    loaded)."""
    return int(torch.ops.linattn_native.cache_bytes()) if ready() else 0


def ready() -> bool:
    """True when the fused code is enabled and already loaded (never starts a build)."""
    return _enabled() and bool(_state.get("ok"))


def fast_step():
    """``linattn.ops.recurrent_step``'s eager fast path in one C++ call (``csrc/python.cpp``,
    bound with pybind11, not through torch.ops), or None unless ``ready()``. Called as
    ``(state, q, k, v, beta, g, scale, rule, gate, out, b)`` (scale, rule, gate: None to infer
    them) on a float32 CPU state, it returns None where the path does not apply (a graph to
    record, an empty state), else the step's o_t (an empty 1-D tensor: a value out of range);
    a refused shape or type raises."""
    return _state.get("step") if _enabled() else None  # "step": set once loaded (``_load``)


def recurrent_step(
    state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    scale: float,
    rule: str | None = None,
    source: Tensor | None = None,
) -> Tensor | None:
    """One generation step on float32 CPU tensors (``linattn.ops.recurrent_step``'s fused path):
    o [B, H, V], the state [B, H, K, V] (contiguous) updated in place; None when a value is out
    of range: an input (NaN or Inf, beta outside [0, 2], g > 0; the state unchanged) or the state
    (not finite entering or leaving the step, found in its pass: the step has run).

    ``rule``: "additive", "delta" or "dplr" (beta then [B, H, 2K] = [a | b]); None: "delta"
    where beta is given, else "additive". The gate follows g: None, [B, H] or [B, H, 1] one
    per head, [B, H, K] one per key channel. ``source``: the state entering the step, read from
    it (the new state written into ``state``); None: in place."""
    B, H = state.shape[:2]
    if rule is None:
        rule = "additive" if beta is None else "delta"
    gate = "none"
    if g is not None:
        gate = "head" if g.dim() == 2 or g.shape[-1] == 1 else "channel"
        g = g.reshape(B, H, -1)
    o = kernel("recurrent_step")(state, q, k, v, beta, g, float(scale), rule, gate, source)
    return None if o.dim() == 1 else o  # the kernel's empty 1-D answer: a value out of range
