"""What a binary of the fused CPU kernels is built from, and whether a given binary fits here.

Shared by the install-time build (``setup.py``, which loads this file by its path, before the
package is importable: so it imports nothing of linattn but ``tuning``) and the loader
(``_native``). Every build, at install time or just in time, compiles one more source generated
from ``info_source``: a string constant ``LINATTN-BUILD-INFO:key=value;...`` naming the sources'
hash, the torch it was compiled against and the instruction set it targets. The loader reads that
string from the file's bytes (``read_info``) before it loads anything, because loading a binary
registers its ops for the life of the process: a binary that does not fit must be refused unloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import mmap
import os
import platform
from pathlib import Path

if __package__:
    from linattn.ops import tuning
else:  # loaded by path from setup.py: the package is not importable yet
    _spec = importlib.util.spec_from_file_location(
        "_linattn_tuning", Path(__file__).with_name("tuning.py")
    )
    tuning = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(tuning)

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
NATIVE = "native"  # -march=native: the build machine's own instruction set
# What an x86-64 microarchitecture level needs of the processor (the flags /proc/cpuinfo names),
# so that a binary built for a level is refused, not run into an illegal instruction, on a
# processor below it. A distributable wheel is built for x86-64-v3 (LINATTN_ARCH).
LEVEL_FLAGS = {
    "x86-64": set(),
    "x86-64-v2": {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"},
    "x86-64-v3": {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"},
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
}
LEVEL_FLAGS["x86-64-v3"] |= LEVEL_FLAGS["x86-64-v2"]
LEVEL_FLAGS["x86-64-v4"] |= LEVEL_FLAGS["x86-64-v3"]
MARKER = b"LINATTN-BUILD-INFO:"


def flags(arch: str = NATIVE) -> list[str]:
    """The compiler flags of a build for ``arch`` (a ``-march`` value).

    -fopenmp: at::parallel_for is a header template whose ``#pragma omp parallel`` is compiled into
    the extension (PyTorch's OpenMP backend): without the flag the pragma is ignored and every
    "parallel" loop runs on the calling thread alone. It is not passed to the link: the
    extension's libgomp.so.1 is the one torch has loaded (one OpenMP runtime in the process; with
    it at the link, a second load of the same build in one process aborted on a duplicate
    TORCH_LIBRARY)."""
    return [
        "-O3",
        f"-march={arch}",
        "-fopenmp",
        "-fopenmp-simd",
        *(f"-D{k}={v}" for k, v in DEFINES.items()),
    ]


def source_key(files: list[Path] | None = None) -> str:
    """A hash of every source and header (path and bytes) and of the tuning constants: two
    binaries with the same key are compiled from the same code."""
    digest = hashlib.sha256(repr(sorted(DEFINES.items())).encode())
    for path in FILES if files is None else files:
        digest.update(path.relative_to(CSRC).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cpu_flags() -> set[str]:
    """The processor's feature flags as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_signature() -> str:
    """A hash of what ``-march=native`` compiles for: the machine, its model and its flags."""
    text = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                text += line
                if line.startswith(("flags", "Features")):
                    break
    except OSError:
        text += platform.processor()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_info(torch_version: str, arch: str = NATIVE) -> dict[str, str]:
    """What a build made now, here, for ``arch`` records about itself."""
    info = {"source": source_key(), "torch": torch_version, "arch": arch}
    if arch == NATIVE:
        info["cpu"] = cpu_signature()
    return info


def info_source(info: dict[str, str]) -> str:
    """The C++ source that records ``info`` in the binary (``read_info`` finds it)."""
    text = ";".join(f"{k}={v}" for k, v in info.items())
    if any(c in text for c in '"\\\n'):
        raise ValueError(f"a build info value cannot be put in a C string: {text!r}")
    return (
        "// Generated by linattn's build: what this binary was compiled from and for. The loader\n"
        "// (linattn.ops._native) reads it from the file before loading it.\n"
        'extern "C" __attribute__((used, visibility("default")))\n'
        f'const char linattn_build_info[] = "{MARKER.decode()}{text}";\n'
    )


def read_info(path: Path) -> dict[str, str] | None:
    """The build info a binary carries, or None (no such file, or none recorded)."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m:
            start = m.find(MARKER)
            if start < 0:
                return None
            end = m.find(b"\0", start)
            text = m[start + len(MARKER) : end].decode("ascii", "replace")
    except (OSError, ValueError):  # missing, unreadable, empty
        return None
    return dict(item.split("=", 1) for item in text.split(";") if "=" in item)


def misfit(info: dict[str, str] | None, torch_version: str, key: str | None = None) -> str | None:
    """Why a binary with ``info`` cannot be loaded here (None: it can): built from other
    sources, for another torch, or for an instruction set this processor lacks."""
    if info is None:
        return "it records no build info"
    if info.get("torch") != torch_version:
        return f"it was built for torch {info.get('torch')}, and torch {torch_version} is loaded"
    if info.get("source") != (source_key() if key is None else key):
        return "it was built from other sources than these (csrc/ changed since)"
    arch = info.get("arch", "")
    if arch == NATIVE and info.get("cpu") != cpu_signature():
        return "it was built with -march=native on another processor"
    have = cpu_flags()  # empty where /proc/cpuinfo cannot be read: then not checked
    missing = sorted(LEVEL_FLAGS.get(arch, set()) - have)
    if have and missing:
        return f"it was built for {arch}, and this processor lacks {', '.join(missing)}"
    return None


def arch_from_environment() -> str:
    """The instruction set an install-time build targets: ``LINATTN_ARCH`` or native."""
    arch = os.environ.get("LINATTN_ARCH", "").strip() or NATIVE
    if not arch.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"LINATTN_ARCH must be a -march value such as x86-64-v3, got {arch!r}")
    return arch
