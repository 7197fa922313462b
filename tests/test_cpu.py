"""linattn.cpu: glibc's allocator keeps freed memory after ``tune_malloc`` (in a child process)."""

import platform
import subprocess
import sys

import pytest

# A 4 MiB malloc is served by mmap under glibc's defaults (threshold 128 KiB) and from the heap
# once tune_malloc has raised the threshold to 32 MiB; mallinfo2().hblks counts the mmap'd blocks.
CHILD = """
import ctypes, ctypes.util, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def mmapped_blocks_while_holding_4_mib():
    p = libc.malloc(4 * 2**20)
    n = libc.mallinfo2().hblks
    libc.free(p)
    return n
before = mmapped_blocks_while_holding_4_mib() - libc.mallinfo2().hblks
from linattn.cpu import tune_malloc
applied = tune_malloc()
after = mmapped_blocks_while_holding_4_mib() - libc.mallinfo2().hblks
print(applied, before, after)
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_tune_malloc_serves_megabytes_from_the_heap():
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", "1", "0"]


def test_empty_cache_returns_the_blocks_the_fused_code_keeps():
    import gc

    import torch

    from linattn import cpu
    from linattn.ops import _native

    if not _native.available():
        pytest.skip(f"fused code unavailable: {_native.reason()}")
    gc.collect()  # and none while counting: it could free another test's tensors into the cache
    gc.disable()
    try:
        cpu.empty_cache()
        x = _native.empty((4, 2**20), torch.zeros(1))  # 16 MiB
        del x
        assert cpu.cached_bytes() == 16 * 2**20
        assert cpu.empty_cache() == 16 * 2**20 and cpu.cached_bytes() == 0
    finally:
        gc.enable()
