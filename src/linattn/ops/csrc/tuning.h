// The machine-tuned constants of the kernels, from ``linattn/ops/tuning.py`` (why each has its
// value is written there): ``_native.py`` passes them as -D defines when it compiles, and they
// are part of the build's name, so a changed value builds anew. They change speed and memory,
// never results. Constants that are mathematics (the gate floor, the factor budget) are in gates.h.
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(LINATTN_MAX_CHUNK) || !defined(LINATTN_HUGE_MIN_BYTES) || \
    !defined(LINATTN_CACHE_MIB) || !defined(LINATTN_STEP_GRAIN) || !defined(LINATTN_SPLIT_IMBALANCE)
#error "compile with the -D defines of linattn/ops/_native.py's DEFINES (from tuning.py)"
#endif

namespace linattn_native {

// The longest chunk, C = min(chunk size, T): a thread keeps a few C x C blocks (tuning.MAX_CHUNK).
constexpr int64_t kMaxChunk = LINATTN_MAX_CHUNK;

// Tensors from this many bytes up are taken from the block cache (tuning.HUGE_MIN_BYTES).
constexpr size_t kHugeMinBytes = LINATTN_HUGE_MIN_BYTES;

// The most the block cache keeps, in MiB, without LINATTN_CACHE_MIB set (tuning.CACHE_MIB).
constexpr long long kCacheMib = LINATTN_CACHE_MIB;

// The least work of one thread's task in the generation step, in state numbers
// (tuning.STEP_GRAIN).
constexpr int64_t kStepGrain = LINATTN_STEP_GRAIN;

static_assert(kStepGrain >= 1, "LINATTN_STEP_GRAIN must be >= 1");
static_assert(kMaxChunk >= 1, "LINATTN_MAX_CHUNK must be >= 1");
static_assert(kCacheMib >= 0, "LINATTN_CACHE_MIB must be >= 0");

}  // namespace linattn_native
