"""CPU settings that make the chunk forms faster: glibc's allocator keeps freed memory.

The chunk form's group loop creates and frees tensors of about a megabyte many thousands of times
per call (the products, gates and gradients of each cache-sized group). glibc serves such sizes
with a fresh ``mmap`` or returns the top of its heap to the system once more than a few megabytes
are free; either way the next tensor's pages fault in again, and on a virtual machine a page fault
costs about as much as the arithmetic on the page. ``tune_malloc`` tells glibc to serve everything
below 32 MiB from its heap (``M_MMAP_THRESHOLD``), to keep up to 2 GiB of freed memory
(``M_TRIM_THRESHOLD``) and to grow the heap 256 MiB at a time (``M_TOP_PAD``): the same as starting
Python with ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=2147483647
MALLOC_TOP_PAD_=268435456``. It is process-wide and the process keeps the memory it has used, so
linattn never calls it for you; ``linattn bench --tune-malloc`` measures it.

The fused C++ chunk form keeps its own, bounded cache of the large blocks its outputs, saved
states and gradients live in (``LINATTN_CACHE_MIB``, default 1024 MiB; 0 keeps nothing): a block
freed by its tensor serves the next tensor of its size without the kernel zeroing its pages
again. ``empty_cache`` returns those blocks to the system, as ``torch.cuda.empty_cache`` does for
PyTorch's GPU cache; ``cached_bytes`` says how much is kept.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from linattn.ops import native

# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MALLOC_SETTINGS = {
    M_MMAP_THRESHOLD: 32 * 2**20,  # glibc's largest allowed value on 64-bit
    M_TRIM_THRESHOLD: 2**31 - 1,  # mallopt takes an int
    M_TOP_PAD: 256 * 2**20,
}
DESCRIPTION = "glibc malloc tuned: mmap threshold 32 MiB, trim threshold 2 GiB, top pad 256 MiB"


def tune_malloc() -> bool:
    """Apply ``MALLOC_SETTINGS`` with glibc's ``mallopt``; False where there is no glibc.

    It helps where the PyTorch loop's page faults dominate (linear attention's forward and
    backward on two threads); elsewhere it changes little (``benchmarks/README.md``).
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in MALLOC_SETTINGS.items())


def empty_cache() -> int:
    """Return the blocks the fused chunk form keeps for reuse to the system; the bytes returned."""
    return native.cache_release()


def cached_bytes() -> int:
    """Bytes of freed output blocks the fused chunk form keeps for reuse."""
    return native.cache_bytes()
