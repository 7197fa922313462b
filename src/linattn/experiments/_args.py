"""argparse types shared by the commands: each rejects bad values with a message (exit status 2)."""

from __future__ import annotations

import argparse
import math
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def _int_at_least(text: str, low: int) -> int:
    """The integer ``text`` says, or an ArgumentTypeError unless it is one and >= ``low``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (a seed)."""
    return _int_at_least(text, 0)


def int_list(text: str) -> list[int]:
    """An argparse type: a comma-separated list of integers >= 1, such as 8,16,32."""
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected integers >= 1 separated by commas, got {text!r}"
        )
    return [positive_int(part) for part in parts]


def name_list(choices: Sequence[str], what: str = "names") -> Callable[[str], tuple[str, ...]]:
    """An argparse type: comma-separated names from ``choices``, such as kda,kda,softmax.

    ``what`` names the kind in the message ("unknown mixers ['mamba'] ...").

    An empty item ("kda,,softmax", a trailing comma) is refused, not skipped: it is a typo, and
    skipping it would silently build another model than the one asked for.
    """

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(part.strip() for part in text.split(","))
        if not text.strip() or any(not name for name in names):
            raise argparse.ArgumentTypeError(f"expected names separated by commas, got {text!r}")
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {unknown} in {text!r}; choose from {', '.join(choices)}"
            )
        return names

    return parse


def _writable_ancestor(option: str, path: Path) -> None:
    """The nearest existing folder above ``path`` is a folder that accepts a new file."""
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is a file, not a folder")
    try:
        # A probe file, since os.access says yes to root on a read-only or special file system.
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as error:
        raise ValueError(f"{option} {path}: cannot write in {parent} ({error.strerror})") from None


def output_file(option: str, path: str | Path) -> Path:
    """Check, before any work, that ``path`` can be written as a file; return it as a Path.

    A folder is refused (matplotlib would write ``DIR.png`` beside it, and ``open`` fails only
    at the end, after the work); so is a path below a file or in a folder we cannot write.
    Nothing is created: missing folders are made when the file is written.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; expected a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path} is not writable")
    _writable_ancestor(option, path)
    return path


def output_dir(option: str, path: str | Path) -> Path:
    """Check, before any work, that ``path`` is (or can be made) a writable folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file; expected a folder")
    _writable_ancestor(option, path / "probe")
    return path


# The largest input file a command reads (a bench.json is kilobytes, an mqar.jsonl megabytes).
MAX_INPUT_BYTES = 256 * 2**20


def human_bytes(n: float) -> str:
    """n bytes in binary units: 512 B, 1.5 KiB, ..., 2.3 TiB, 1.4e+06 YiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
    exponent = 0 if n < 1024 else min(int(math.log(n, 1024)), len(units) - 1)
    value = n / 1024**exponent
    return f"{value:.0f} B" if exponent == 0 else f"{value:.3g} {units[exponent]}"


def machine_memory() -> int:
    """This machine's physical memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def check_memory(options: str, nbytes: float, memory: int | None = None) -> None:
    """Refuse, before any work, sizes whose tensors alone would not fit in the machine's memory.

    options: the size options as typed (``"--T 10000000000 --K 16 --V 16"``); nbytes: what the
    command's largest tensors take at those sizes (a lower bound of its peak); memory: the
    machine's (default ``machine_memory()``; 0: unknown, nothing refused).

    Raises:
        ValueError: nbytes is more than memory, naming the options and both sizes.
    """
    memory = machine_memory() if memory is None else memory
    if memory and nbytes > memory:
        raise ValueError(
            f"{options} would take at least {human_bytes(nbytes)} of memory; "
            f"this machine has {human_bytes(memory)}"
        )


def input_file(option: str, path: str | Path, limit: int = MAX_INPUT_BYTES) -> Path:
    """Check, before any work, that ``path`` is a regular file of at most ``limit`` bytes.

    A device or a pipe (``/dev/zero``, ``/dev/stdin``) is refused, since reading it may never end;
    so is a missing file or a larger one. Returns ``path`` as a Path.

    Raises:
        ValueError: naming the option, the path and the reason.
    """
    path = Path(path)
    try:
        info = path.stat()
    except OSError as error:
        raise ValueError(f"{option} {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{option} {path} is not a regular file")
    if info.st_size > limit:
        raise ValueError(
            f"{option} {path} is {human_bytes(info.st_size)}, more than the "
            f"{human_bytes(limit)} an input file may be"
        )
    return path


def kernel_timing_arguments(parser: argparse.ArgumentParser, repeats: int) -> None:
    """The options of the benchmarks that time one kernel shape against another in one process
    (benchmarks/bf16.py, rwkv6.py): --T, --H, --K (= V), --C (the chunk size), --threads,
    --repeats (``repeats`` by default), --clock (wall or this process's CPU time), --out."""
    parser.add_argument("--T", type=int, default=16_384)
    parser.add_argument("--H", type=int, default=8)
    parser.add_argument("--K", type=int, default=64, help="K = V")
    parser.add_argument("--C", type=int, default=64, help="chunk size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--out", type=Path, help="write the result as JSON")
