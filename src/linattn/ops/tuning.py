"""The machine-tuned constants of the ops, in one place, each with how it was chosen.

They change speed and memory, never results: every value gives the same outputs to rounding (the
tests run the chunk form at several of them). The C++ kernels (``csrc/``) take the ones they use
from here when they are compiled.
"""

from __future__ import annotations

# The longest chunk the chunk form takes, C = min(chunk_size, T) of the longest sequence: each
# chunk is computed with C x C blocks (256 MiB each in float32 at this size; the fused C++ loop
# keeps a few per thread, and checks the same limit). Chunks of 64 to 256 tokens are the fast
# ones; a larger one is never faster, and an 8,192-token delta chunk is already 2e-5 from float64.
MAX_CHUNK = 8192

# Token-heads per group and per torch thread in the PyTorch chunk loop: 4 chunks of 64 tokens of
# 8 heads, about 0.5 MB per input in float32, so that each thread's share of a group's working set
# stays in its core's L2 cache. Measured on the 2-core development machine (T = 16,384, H = 8,
# medians of 7 interleaved runs): on one thread, 2,048 token-heads per group are 3-7% faster than
# 4,096 and 10-30% faster than 8,192-32,768; on two threads, 4,096 token-heads (2,048 per thread)
# are 2-13% faster than 2,048 for every mechanism, forward and forward + backward (GLA and KDA gain
# the most), and 8,192 and 16,384 are slower again.
GROUP_ROWS_PER_THREAD = 2048

# Quadrants of the PyTorch loop's decayed products up to this size are products of broadcast
# vectors, not tiny matmuls. Measured (8 heads, C = K = 64, the two products of KDA forward and
# backward, medians of 9 in turns, 4 and 8 chunks, 1 and 2 threads): 2 is 4-13% faster than 4 and
# 1, 8 is 32-50% slower; the forward alone is the same for 1, 2 and 4.
SMALL_QUADRANT = 2

# Tensors of at least this many bytes are taken from the C++ block cache (2 MiB pages where Linux
# allows it, a freed block kept for the next tensor of its size): the first touch of a fresh
# 32 MiB tensor then costs 4 ms instead of 15 ms; below 4 MiB PyTorch's own allocator is as fast.
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
# each step one pass over the state); longer ones the chunk form. Measured on the 2-core machine
# under load (issue 35; Qwen3-Next's Gated DeltaNet state, 32 x 128 x 128, B 1, one thread, medians
# of 15 in turns): the chunk form / the steps took 2.8x, 3.0x, 2.7x, 1.8x, 1.5x at T = 1, 2, 3, 4,
# 8 (the chunk form's fixed cost per call against one pass over the state per token).
DECODE_TOKENS = 8

# The C++ chunk form's split schedule (``csrc/schedule.h``: every chunk's terms for all (chunk,
# head) pairs at once, then the state pass per head, then the outputs) is taken where the fused
# schedule (whole heads per thread) would leave at least half of the threads idle, i.e. where
# threads * ceil(P / threads) >= SPLIT_IMBALANCE * P heads: P = 1 on 2 threads, P <= 8 on 16.
# Measured on the 2-core machine (T = 16,384, K = V = 64, linear attention, the delta rule, GLA,
# forward; medians of 3-5 interleaved): its extra memory traffic (every chunk's terms written and
# read again) costs 1.3-1.7x on one thread (H = 8, forward and forward + backward, under load);
# at P = 1 on 2 threads, quiet, it is 1.2-1.3x faster than the fused schedule (which runs the one
# head on one thread): 6.1 / 7.8, 11.2 / 13.3, 8.6 / 11.0 ms. Its state pass stays one thread per
# head. Not measured on more cores (none was at hand).
SPLIT_IMBALANCE = 2.0
