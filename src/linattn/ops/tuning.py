"""The machine-tuned constants of the ops, in one place, each with why it has its value.

They change speed and memory, never results: every value gives the same outputs to rounding (the
tests run the chunk form at several of them). The C++ kernels (``csrc/``) take the ones they use
from here when they are compiled. The measurements that chose them are kept in
``benchmarks/from-the-code.md``.
"""

from __future__ import annotations

# The longest chunk the chunk form takes, C = min(chunk_size, T) of the longest sequence: each
# chunk is computed with C x C blocks (256 MiB each in float32 at this size; the fused C++ loop
# keeps a few per thread, and checks the same limit). Chunks of 64 to 256 tokens are the fast
# ones; a larger one is never faster, and an 8,192-token delta chunk is already 2e-5 from float64.
MAX_CHUNK = 8192

# Token-heads per group and per torch thread in the PyTorch chunk loop: 4 chunks of 64 tokens of
# 8 heads, about 0.5 MB per input in float32, so that each thread's share of a group's working set
# stays in its core's L2 cache: smaller groups pay the loop's overhead more often, larger ones
# spill out of the cache. It was the fastest value per thread, on one and on two threads.
GROUP_ROWS_PER_THREAD = 2048

# Quadrants of the PyTorch loop's decayed products up to this size are products of broadcast
# vectors, not tiny matmuls: a batched matmul of such small blocks costs more in its overhead than
# in its arithmetic, while broadcast products grow with the square of the size.
SMALL_QUADRANT = 2

# Tensors of at least this many bytes are taken from the C++ block cache (2 MiB pages where Linux
# allows it, a freed block kept for the next tensor of its size): a fresh large tensor's first
# touch then faults in far fewer pages; below this size PyTorch's own allocator is as fast.
HUGE_MIN_BYTES = 4 * 2**20

# The most the block cache keeps, in MiB, unless the environment variable LINATTN_CACHE_MIB says
# otherwise (0 keeps nothing): a training step's outputs and gradients at T = 16,384, H = 8,
# K = V = 64 fit, so each step reuses the previous step's blocks.
CACHE_MIB = 1024

# The least work of one thread's task in the fused generation step (``csrc/step.cpp``), in numbers
# of the state (64 KiB of float32): its heads are spread over the threads in tasks of at least
# this many, and its input check in blocks of this many, so that a small batch runs on the calling
# thread and a large one (many sequences served at once) on all. Chosen, not tuned: two passes
# over 64 KiB in the L2 cache take a few microseconds, about what waking a thread costs.
STEP_GRAIN = 16384

# A cached forward of at most this many tokens with a state (a decoding step; a few tokens at once,
# as speculative decoding checks) runs the fused generation step token by token (``_engine.decode``,
# each step one pass over the state); longer ones the chunk form. The chunk form has a fixed cost
# per call, the steps one pass over the state per token: up to this length the steps are cheaper.
DECODE_TOKENS = 8

# The C++ chunk form's split schedule (``csrc/schedule.h``: every chunk's terms for all (chunk,
# head) pairs at once, then the state pass per head, then the outputs) is taken where the fused
# schedule (whole heads per thread) would leave at least half of the threads idle, i.e. where
# threads * ceil(P / threads) >= SPLIT_IMBALANCE * P heads: P = 1 on 2 threads, P <= 8 on 16.
# Its extra memory traffic (every chunk's terms written and read again) makes it slower where the
# fused schedule keeps every thread busy, but where that schedule would leave threads idle the
# split one is faster. Its state pass stays one thread per head. Only 2 cores were at hand to
# choose the value.
SPLIT_IMBALANCE = 2.0

# The narrowest value width an op that chooses its memory's width itself (CyFA's key memory, whose
# values are its M slots) hands to the fused chunk form: a narrower one is padded with zero
# columns up to it, which change no result. The fused loop's products on fewer value columns are
# slower per column than on 16 (the BLAS's narrow-matrix paths), so that at M = 6 slots the padded
# pass is the faster one, forward and backward; wider padding costs more than it saves.
NARROW_VALUES = 16
