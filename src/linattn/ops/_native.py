"""The fused CPU chunk form (``csrc/``): the binary built at install time, or compiled on first use.

The op ``chunk_forward`` runs the chunk form's forward pass chunk by chunk in C++, every block of a
chunk in the cache, with the products on the BLAS that PyTorch links (the PyTorch group loop spends
most of its time moving group-sized tensors through memory, not multiplying). It is the same
algebra as the PyTorch chunk loop (``chunk``) and is checked against it and against float64 in
``tests/ops/test_native.py``. The op ``chunk_backward`` fuses the backward pass of every mechanism
of the mechanism table (docs/design.md) the same way, from the chunk states this forward saves
(``library`` calls both through ``kernel``). ``recurrent_step`` is the generation step with its
checks in one call.

Where the binary comes from, in order:

1. ``linattn/ops/_kernels.<abi>.so``, compiled when the package was built (``setup.py``: ``pip
   install``, ``pip install -e``, ``python -m build``). It records what it was built from
   (``_buildinfo``), and is loaded only if that fits: the same sources, the torch now loaded (the
   C++ ABI of torch changes between releases; the binary is not ported to torch's stable ABI, so it
   is pinned to its torch), an instruction set this processor has.
2. In a source tree (a checkout, where csrc/ may have changed since the install), a just-in-time
   build with ``torch.utils.cpp_extension``, said in one line on stderr, cached under
   ``TORCH_EXTENSIONS_DIR`` (by default ``~/.cache/torch_extensions``) in a folder named by a hash
   of the sources, the flags, torch's version and the processor: two trees of different code each
   keep their own build, and switching between them compiles nothing. ``linattn build`` does it
   ahead of time, in an installed package too.
3. Otherwise the chunk form runs its PyTorch loop, said in one line when ``linattn.ops`` is imported
   (``reason()`` says why). ``LINATTN_NATIVE=0`` chooses the loop, silently.

One process compiles a folder at a time: it holds an ``fcntl.flock`` on ``linattn.lock`` there,
which the system releases when the process ends, however it ends, and writes its pid and start
time into it. A process that finds it held waits, saying for which process and for how long, at
most ``LINATTN_BUILD_TIMEOUT`` seconds (default 1200), then runs the PyTorch loop with a warning; it
never takes the lock from a live process. Under the lock torch's own compile lock (the file
``lock``, which a process killed mid-compile leaves behind) is stale by construction and removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import math
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from linattn.ops import _buildinfo, backends, tuning

CSRC = _buildinfo.CSRC
SOURCES = _buildinfo.SOURCES  # compiled together into one extension
FILES = _buildinfo.FILES  # everything a build depends on
DEFINES = _buildinfo.DEFINES  # the machine-tuned constants, as -D defines
FLAGS = _buildinfo.flags()  # the just-in-time build's: it stays on this machine (-march=native)
LDFLAGS: list[str] = []
MODULE = "_kernels"  # the extension's name, installed or compiled on first use (csrc/python.cpp)
PACKAGE = Path(__file__).parent
# A checkout (src/linattn/ops/ under a pyproject.toml), where the sources can change after the
# install: the only place a first use compiles.
ROOT = Path(__file__).resolve().parents[3]

LOCK_NAME = "linattn.lock"  # our lock in the build directory (torch's own is ``lock``)
DONE_NAME = "built"  # written once a just-in-time build has finished: the binary is whole
BUILD_TIMEOUT_S = 1200.0  # the longest wait for another process's compile (LINATTN_BUILD_TIMEOUT)
WAIT_GRACE_S = 2.0  # how long a wait for the lock lasts before it is announced (compile_lock)
WAIT_REPEAT_S = 30.0  # then how often the wait says how long it has lasted
HOW_TO_GET = (
    "to get them, where a C++ compiler is found, run `linattn build` or reinstall linattn "
    "(pip install --no-build-isolation --force-reinstall --no-deps <its checkout or sdist>)"
)

_state: dict[str, object] = {}
_load_lock = threading.Lock()  # one loading thread per process (flock is per open file)
_keys: dict[str, str] = {}


def source_key() -> str:
    """The hash of the sources and tuning constants (``_buildinfo.source_key``), once a process."""
    if "source" not in _keys:
        _keys["source"] = _buildinfo.source_key(FILES)
    return _keys["source"]


def source_tree() -> bool:
    """Whether this package runs from a checkout (its pyproject.toml two folders above src/)."""
    pyproject = ROOT / "pyproject.toml"
    return pyproject.is_file() and 'name = "linattn"' in pyproject.read_text()


def installed_binary() -> Path | None:
    """The binary the package build put beside this file, if any."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = PACKAGE / f"{MODULE}{suffix}"
        if path.is_file():
            return path
    return None


def compiler() -> str | None:
    """The C++ compiler a just-in-time build would use (``CXX`` or ``c++``), if it is found."""
    return shutil.which(os.environ.get("CXX", "c++"))


def build_name() -> str:
    """The just-in-time build's folder name: a hash of the sources, the flags (the tuning
    constants among them), torch's version, the processor (``-march=native``) and the Python
    ABI, so that a build is reused only by code it was compiled from and for."""
    parts = [
        source_key(),
        repr(FLAGS),
        torch.__version__,
        _buildinfo.cpu_signature(),
        importlib.machinery.EXTENSION_SUFFIXES[0],
    ]
    return "linattn-" + hashlib.sha256(" ".join(parts).encode()).hexdigest()[:16]


def build_timeout() -> float:
    """Seconds to wait for another process's compile: ``LINATTN_BUILD_TIMEOUT`` or 1200."""
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
    """Where the just-in-time build is compiled and cached (``torch.utils.cpp_extension``'s
    directory for it: under ``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``);
    created if needed."""
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(build_name(), verbose=False))


def location() -> Path | None:
    """The file of the loaded binary (None until one is loaded)."""
    path = _state.get("path")
    return Path(str(path)) if path else None


def _say(message: str) -> None:
    print(f"linattn: {message}", file=sys.stderr, flush=True)


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (/proc/<pid>/stat's 22nd field),
    or None: no such process, or no /proc. With the pid it names one process: a pid is reused,
    the pair is not."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[19]  # fields 3 on follow the parenthesised name


def _holder(fd: int) -> str:
    """Who holds the lock, from the record its holder wrote: pid, liveness, start, what for."""
    try:
        record = dict(item.split("=", 1) for item in os.pread(fd, 512, 0).decode().split())
        pid = int(record["pid"])
    except (OSError, ValueError, KeyError):
        return "another process"  # it has taken the lock and not yet written its record
    alive = process_start(pid) == record.get("start")
    started = time.strftime("%H:%M:%S", time.localtime(float(record.get("since", 0))))
    state = "alive" if alive else "not seen here: another machine sharing the folder?"
    return f"process {pid} ({state}; holding it since {started})"


@contextlib.contextmanager
def compile_lock(directory: Path, timeout: float) -> Iterator[None]:
    """Hold the build directory's ``linattn.lock`` (an exclusive ``flock``, released by the
    system when this process ends, however it ends, and never taken from a live holder), with
    this process's pid and start time written in it; wait at most ``timeout`` seconds for another
    process that holds it, then ``TimeoutError``. Under it, a torch compile lock (the file
    ``lock``) is stale, left by a killed compile, and removed. Without ``fcntl`` (Windows),
    torch's lock alone.

    The wait is announced once it has lasted ``WAIT_GRACE_S`` (or half the timeout), naming the
    holder, then every ``WAIT_REPEAT_S`` with the time waited: a process that loads a cached build
    holds the lock for a fraction of a second, and processes started together (a sweep's workers)
    should not each print a line for that."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        start = time.monotonic()
        deadline, announce = start + timeout, start + min(WAIT_GRACE_S, timeout / 2)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError(
                        f"{_holder(fd)} held the compile lock {path} for all of the {timeout:g} s "
                        "this process waits (LINATTN_BUILD_TIMEOUT)"
                    ) from None
                if now >= announce:
                    what = "waiting" if announce < start + WAIT_REPEAT_S / 2 else "still waiting"
                    _say(
                        f"{what} for {_holder(fd)}, which holds {path} while it compiles the "
                        f"fused CPU kernels: {now - start:.0f} s so far, at most {timeout:g} s "
                        "(LINATTN_BUILD_TIMEOUT)"
                    )
                    announce = now + WAIT_REPEAT_S
                time.sleep(0.1)
        pid = os.getpid()
        record = f"pid={pid} start={process_start(pid)} since={time.time():.0f}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        baton = directory / "lock"
        if baton.exists():
            baton.unlink(missing_ok=True)
            _say(f"removed a stale compile lock, {baton}, left by an interrupted build")
        yield
    finally:
        os.close(fd)  # releases the flock


def _import(path: Path):
    """Load the binary at ``path`` as the module ``linattn.ops._kernels`` (its ops register)."""
    spec = importlib.util.spec_from_file_location(f"linattn.ops.{MODULE}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.ops.linattn_native.chunk_forward  # noqa: B018 (the op is registered)
    return module


def _cached(directory: Path) -> Path | None:
    """The just-in-time build in ``directory``, if one finished there and fits."""
    path = directory / f"{MODULE}.so"
    if not (directory / DONE_NAME).is_file():
        return None
    info = _buildinfo.read_info(path)
    return path if _buildinfo.misfit(info, torch.__version__, source_key()) is None else None


def plan() -> tuple[str, Path | None, str]:
    """What loading will do, decided without loading anything: ("installed", path, why) for the
    installed binary; ("compile", None, why the installed one is not used) in a source tree with a
    compiler; ("loop", None, why) otherwise."""
    binary = installed_binary()
    if binary is None:
        why = "no binary was built with this package"
    else:
        why = _buildinfo.misfit(_buildinfo.read_info(binary), torch.__version__, source_key())
        if why is None:
            return "installed", binary, ""
        why = f"the installed binary does not fit: {why}"
    if source_tree() and compiler() is not None:
        return "compile", None, why
    if compiler() is None:
        why += ", and no C++ compiler is found to build them"
    return "loop", None, why


def _compile_and_load(timeout: float, why: str) -> tuple[str, Path, object]:
    """The just-in-time build: found in the cache, or compiled there under ``compile_lock``;
    (how, its file, the module)."""
    from torch.utils import cpp_extension

    directory = build_directory()
    path = _cached(directory)
    if path is not None:  # a finished build is only read: no lock
        return f"loaded from the build cache, {directory}", path, _import(path)
    with compile_lock(directory, timeout):
        path = _cached(directory)  # another process may have built it while this one waited
        if path is not None:
            return f"loaded from the build cache, {directory}", path, _import(path)
        (directory / DONE_NAME).unlink(missing_ok=True)
        generated = directory / "build_info.cpp"
        generated.write_text(_buildinfo.info_source(_buildinfo.build_info(torch.__version__)))
        _say(
            f"{why}: compiling the fused CPU kernels from csrc/ ({len(SOURCES)} files), once, "
            f"2-4 min on 2 cores (cached in {directory}) ..."
        )
        start = time.monotonic()
        module = cpp_extension.load(
            name=MODULE,
            sources=[str(path) for path in [*SOURCES, generated]],
            extra_cflags=FLAGS,
            extra_ldflags=LDFLAGS,
            build_directory=str(directory),
            is_python_module=True,  # csrc/python.cpp; the ops register on loading too
            verbose=False,
        )
        torch.ops.linattn_native.chunk_forward  # noqa: B018 (the op is registered)
        (directory / DONE_NAME).write_text(f"{source_key()}\n")
        seconds = time.monotonic() - start
    _say(f"compiled in {seconds:.0f} s")
    return f"compiled in {seconds:.0f} s into {directory}", directory / f"{MODULE}.so", module


def _load(compile_anywhere: bool = False) -> None:
    """Load the installed binary, or the just-in-time build (compiled first where it is missing,
    in a source tree or when ``compile_anywhere``); record why not otherwise."""
    if "ok" in _state:
        return
    timeout = build_timeout()  # a bad LINATTN_BUILD_TIMEOUT raises, naming it
    with _load_lock:
        if "ok" in _state:
            return
        how, binary, why = plan()
        if how == "installed":
            try:
                module = _import(binary)
                info = _buildinfo.read_info(binary) or {}
                _state.update(
                    ok=True,
                    path=binary,
                    step=module.fast_step,
                    reason=f"installed, built for torch {info.get('torch')} with "
                    f"-march={info.get('arch')}: {binary}",
                )
                return
            except Exception as error:  # a binary that does not load: a source tree compiles
                why = f"the installed binary did not load ({type(error).__name__}: {error})"
                how = "compile" if source_tree() and compiler() else "loop"
        if how == "loop" and not compile_anywhere:
            _state.update(ok=False, reason=f"unavailable: {why}")
            return
        try:
            text, path, module = _compile_and_load(timeout, why)
        except Exception as error:  # no compiler, a failed build, a lock held too long
            kind = "not built" if isinstance(error, TimeoutError) else "build failed"
            _state.update(ok=False, reason=f"{kind}: {type(error).__name__}: {error}")
            warnings.warn(
                f"linattn: the fused CPU chunk forward is unavailable ({_state['reason']}); "
                "the chunk form runs its PyTorch loop",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        _state.update(ok=True, reason=text, path=path, step=module.fast_step)


def _environ_reader() -> Callable[[], bool]:
    """``os.environ.get("LINATTN_NATIVE", "1") != "0"`` as a function, read at every call.

    ``os.environ.get`` encodes the key and decodes the value on every call: 0.7 us, a fifth of
    the Python around a decoding step. CPython's ``os.environ`` keeps the encoded pairs in a
    dict (``_data``, with ``encodekey`` / ``encodevalue``; every change made through
    ``os.environ`` lands there, as before), which is read directly where it has that form
    (0.06 us); elsewhere, ``os.environ.get``."""
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
    """True when the fused code is enabled and loaded (loading it on the first call: the
    installed binary, or in a source tree a build compiled once; a disabled session never
    loads it); False inside ``linattn.ops.backend("torch")``, which asks for the PyTorch loop."""
    if not _enabled() or backends.loop_only():
        return False
    _load()
    return bool(_state["ok"])


def load(compile_anywhere: bool = False) -> None:
    """Load the kernels now, unless disabled: the installed binary, else the just-in-time build
    (compiled first if need be) in a source tree, or anywhere with ``compile_anywhere``
    (``linattn build``)."""
    if _enabled():
        _load(compile_anywhere)


def reason() -> str:
    """Why ``available()`` is what it is."""
    if not _enabled():
        return "disabled by LINATTN_NATIVE=0"
    _load()
    return str(_state["reason"])


def announce() -> None:
    """At import: where the kernels will not run, say so in one line, with how to get them."""
    if not _enabled():
        return
    how, _, why = plan()
    if how == "loop":
        _say(f"the fused CPU kernels are unavailable ({why}): the PyTorch loop runs; {HOW_TO_GET}")


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
    rule: str,
    source: Tensor | None = None,
) -> Tensor | None:
    """One generation step on float32 CPU tensors (``linattn.ops.recurrent_step``'s fused path):
    o [B, H, V], the state [B, H, K, V] (contiguous) updated in place; None when a value is out
    of range: an input (NaN or Inf, beta outside [0, 2], g > 0; the state unchanged) or the state
    (not finite entering or leaving the step, found in its pass: the step has run).

    ``rule``: a built-in rule's name (its inputs in beta's slot: the delta rule's beta [B, H],
    the dplr rule's [a | b] [B, H, 2K]). The gate follows g: None, [B, H] or [B, H, 1] one
    per head, [B, H, K] one per key channel. ``source``: the state entering the step, read from
    it (the new state written into ``state``); None: in place."""
    B, H = state.shape[:2]
    gate = "none"
    if g is not None:
        gate = "head" if g.dim() == 2 or g.shape[-1] == 1 else "channel"
        g = g.reshape(B, H, -1)
    o = kernel("recurrent_step")(state, q, k, v, beta, g, float(scale), rule, gate, source)
    return None if o.dim() == 1 else o  # the kernel's empty 1-D answer: a value out of range


announce()
