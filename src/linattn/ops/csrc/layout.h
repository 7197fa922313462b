// Where a chunk's rows are: the [B, H, T, D] views of the public [B, T, H, D] tensors, read and
// written in place with their strides, or copied once where the BLAS cannot read them.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>

#include "block_cache.h"
#include "checks.h"

namespace linattn_native {

// x [B, H, T, D] as the BLAS reads its rows: in place when each row is contiguous (unit stride
// along D, or D <= 1) and the rows a valid leading dimension apart (T <= 1, or a time stride from
// D up to the BLAS's 32-bit range); otherwise a contiguous copy (an expanded time dimension,
// overlapping rows, a transposed last dimension, a huge stride).
inline at::Tensor blas_rows(const at::Tensor& x) {
  const int64_t T = x.size(2), D = x.size(3);
  const bool unit = D <= 1 || x.stride(3) == 1;
  const bool rows = T <= 1 || (x.stride(2) >= D && x.stride(2) <= INT32_MAX);
  return unit && rows ? x : at::empty(x.sizes(), x.options()).copy_(x);
}

// x [..., D] with unit stride along D (as the elementwise loops read it), else a contiguous copy.
inline at::Tensor unit_rows(const at::Tensor& x) {
  return x.size(-1) <= 1 || x.stride(-1) == 1 ? x : x.contiguous();
}

// A fresh [B, T, HV, D] tensor seen as [B, HV, T, D]: the public layout of the value heads,
// written head by head.
inline at::Tensor fresh_public(const Sizes& n, int64_t D, const at::TensorOptions& options) {
  return fresh({n.B, n.T, n.HV, D}, options).transpose(1, 2);
}

// n floats rounded up to a whole number of 64-byte cache lines (16 floats): the offset of each
// term in the split schedules' slots, so that every term starts 64-byte aligned as the fused
// schedule's blocks start at least 16-byte aligned. The BLAS's small-matrix kernels may round
// differently on operands that are not 16-byte aligned (MKL does on this project's AMD machine:
// an odd offset made the split schedule's Gated DeltaNet differ in the last bit from the fused).
inline int64_t padded(int64_t n) { return (n + 15) / 16 * 16; }

// The first row of chunk t0 of head (b, h) in a [B, H, T, ...] tensor with any strides.
template <typename T>
inline T* chunk_rows(const at::Tensor& x, T* base, int64_t b, int64_t h, int64_t t0) {
  return base + b * x.stride(0) + h * x.stride(1) + t0 * x.stride(2);
}

}  // namespace linattn_native
