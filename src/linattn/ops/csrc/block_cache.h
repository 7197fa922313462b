// Uninitialised CPU tensors for the kernels' outputs, from large ones up in blocks of a cache of
// 2 MiB-page mappings (``BlockCache``, block_cache.cpp), so that a training step's outputs reuse
// the previous step's pages instead of faulting in and zeroing fresh ones.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace linattn_native {

// An uninitialised tensor of ``sizes``; from ``kHugeMinBytes`` (tuning.h) up, in a cached block.
at::Tensor fresh(at::IntArrayRef sizes, const at::TensorOptions& options);

// ``fresh`` for Python (the op ``empty_huge``), its sizes checked.
at::Tensor empty_huge(at::IntArrayRef sizes, at::ScalarType dtype);

// Return every kept block to the system; the bytes returned (the op ``cache_release``).
int64_t cache_release();

// The bytes of freed blocks the cache keeps for reuse (the op ``cache_bytes``).
int64_t cache_bytes();

}  // namespace linattn_native
