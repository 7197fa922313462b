"""The package with its fused CPU kernels compiled in, once, when it is built.

``pip install --no-build-isolation .`` (or ``-e .``) and ``python -m build --no-isolation`` compile
``src/linattn/ops/csrc`` into ``linattn/ops/_kernels.<abi>.so`` with ``torch.utils.cpp_extension``
against the torch installed in the environment: the binary is only valid with that torch (its C++
ABI is not stable across releases), and the loader (``linattn.ops._native``) refuses it under any
other. Build isolation would compile against a torch of its own (on Linux, PyPI's several-GB CUDA
build), hence no torch among the build requirements and the ``--no-build-isolation`` in the README.

``LINATTN_ARCH`` picks the instruction set (``-march``): ``native`` by default, for a build that
stays on its machine; ``x86-64-v3`` (AVX2 and FMA) for a wheel meant for other machines.
``LINATTN_BUILD_KERNELS=0`` builds the package without them (then a source tree compiles them on
first use, and an installed package runs the PyTorch loop).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
NAME = "linattn.ops._kernels"

_spec = importlib.util.spec_from_file_location(
    "_linattn_buildinfo", ROOT / "src" / "linattn" / "ops" / "_buildinfo.py"
)
buildinfo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(buildinfo)
SOURCES = [path.relative_to(ROOT).as_posix() for path in buildinfo.SOURCES]

NO_TORCH = (
    "linattn: building the fused CPU kernels needs torch in the build environment, the torch the "
    "package will run with. Install it first (pip install torch==2.13.0), then build without "
    "isolation: pip install --no-build-isolation ., or python -m build --no-isolation. "
    "LINATTN_BUILD_KERNELS=0 builds the package without the kernels."
)


def _say(message: str) -> None:
    print(f"linattn: {message}", file=sys.stderr, flush=True)


try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:  # an sdist needs no torch; a build of the kernels says what to do
    torch = None

    class KernelBuild(build_ext):
        def run(self) -> None:
            raise SystemExit(NO_TORCH)

    def kernels() -> Extension:
        return Extension(NAME, sources=SOURCES)

else:

    class KernelBuild(BuildExtension):
        """BuildExtension with the build's record compiled in and a progress line."""

        def build_extensions(self) -> None:
            arch = buildinfo.arch_from_environment()
            info = buildinfo.build_info(torch.__version__, arch)
            generated = Path(self.build_temp).resolve() / "linattn_generated" / "build_info.cpp"
            generated.parent.mkdir(parents=True, exist_ok=True)
            generated.write_text(buildinfo.info_source(info))
            for extension in self.extensions:
                extension.sources = [*SOURCES, str(generated)]
                extension.extra_compile_args = [*buildinfo.flags(arch), "-g0"]  # no debug info
            _say(
                f"compiling the fused CPU kernels ({len(SOURCES)} files, -march={arch}, torch "
                f"{torch.__version__}), once: 2-4 min on 2 cores ..."
            )
            start = time.monotonic()
            super().build_extensions()
            _say(f"compiled the fused CPU kernels in {time.monotonic() - start:.0f} s")

    def kernels() -> Extension:
        return CppExtension(NAME, sources=SOURCES)


if os.environ.get("LINATTN_BUILD_KERNELS", "1") == "0":
    setup()
else:
    setup(ext_modules=[kernels()], cmdclass={"build_ext": KernelBuild})
