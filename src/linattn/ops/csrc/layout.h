// Where a chunk's rows are: the [B, H, T, D] views of the public [B, T, H, D] tensors, read and
// written in place with their strides, or copied once where the BLAS cannot read them.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "block_cache.h"
#include "checks.h"
#include "convert.h"
#include "terms.h"

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
// written head by head (``rows``: T, or q's rows T / R).
inline at::Tensor fresh_public(const Sizes& n, int64_t D, const at::TensorOptions& options,
                               int64_t rows = -1) {
  return fresh({n.B, rows < 0 ? n.T : rows, n.HV, D}, options).transpose(1, 2);
}

// The query rows of a chunk's c write rows (R each: ``Sizes``, checks.h): row i of a block
// [c, ld] (Qd, A_q) at the last write row of group i, i R + R - 1; c / R of them, R ld apart.
struct QueryRows {
  int rows;
  int64_t first, step;  // the offset of the first row and the rows' stride, in elements
};
inline QueryRows query_rows(int c, int64_t R, int64_t ld) {
  return {static_cast<int>(c / R), (R - 1) * ld, R * ld};
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

// The c / R query rows of m values, row i of x (row stride ldx) to row i R + R - 1 of y [c, m]
// (``spread_queries``; the other rows of y untouched), and back (``gather_queries``).
inline void spread_queries(int c, int64_t R, int64_t m, const float* x, int64_t ldx, float* y) {
  for (int64_t i = 0; i < c / R; ++i) {
    std::memcpy(y + (i * R + R - 1) * m, x + i * ldx, sizeof(float) * m);
  }
}
inline void gather_queries(int c, int64_t R, int64_t m, const float* y, float* x, int64_t ldx) {
  for (int64_t i = 0; i < c / R; ++i) {
    std::memcpy(x + i * ldx, y + (i * R + R - 1) * m, sizeof(float) * m);
  }
}

// The rows of chunk n (tokens [n C, n C + c)) of value head p: q and k of its q/k head (grouped
// value heads share them), v, beta and g (undefined: none) of its own; each read in place where
// float32 with its rows side by side, else copied or converted into ``stage``'s blocks 0-4
// (``read_rows``, convert.h). q's rows from n C / R, c / R
// of them (R > 1: the chunk's query rows, which the kernels spread over its write rows from these
// float32 rows, ``spread_queries``).
inline ChunkRows input_rows(const Sizes& sz, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& beta, const at::Tensor& g,
                            int64_t n, int64_t p, Staging& stage) {
  const int64_t b = p / sz.HV, h = p % sz.HV, hq = sz.qk_head(h), t0 = n * sz.C;
  const int c = static_cast<int>(std::min<int64_t>(sz.C, sz.T - t0));
  const FloatRows none{nullptr, 0};
  const FloatRows qr = read_rows(q, b, hq, t0 / sz.R, static_cast<int>(c / sz.R), stage.block(0));
  const FloatRows kr = read_rows(k, b, hq, t0, c, stage.block(1));
  const FloatRows vr = read_rows(v, b, h, t0, c, stage.block(2));
  const FloatRows br = beta.defined() ? read_rows(beta, b, h, t0, c, stage.block(3)) : none;
  const FloatRows gr = g.defined() ? read_rows(g, b, h, t0, c, stage.block(4)) : none;
  return {qr.p, kr.p, vr.p, qr.ld, kr.ld, vr.ld, br.p, br.ld, gr.p, gr.ld, c};
}

// Ask the L2 cache for rows [t0, t0 + rows) of head (b, h) of x [B, H, T, D] or [B, H, T] (any
// strides and dtype; undefined, or no rows: nothing), to be read or (``write``) written. A hint:
// no effect on any result.
inline void prefetch_rows(const at::Tensor& x, int64_t b, int64_t h, int64_t t0, int64_t rows,
                          bool write = false) {
  if (!x.defined() || rows <= 0) return;
  const int64_t size = x.element_size(), bytes = (x.dim() == 4 ? x.size(3) : 1) * size;
  const char* first = static_cast<const char*>(x.data_ptr()) +
                      (b * x.stride(0) + h * x.stride(1) + t0 * x.stride(2)) * size;
  for (int64_t i = 0; i < rows; ++i) {
    const uintptr_t row = reinterpret_cast<uintptr_t>(first + i * x.stride(2) * size);
    for (uintptr_t line = row & ~uintptr_t{63}; line < row + bytes; line += 64) {
      const void* address = reinterpret_cast<const void*>(line);
      write ? __builtin_prefetch(address, 1, 2) : __builtin_prefetch(address, 0, 2);
    }
  }
}

// ``prefetch_rows`` of what ``input_rows`` reads of chunk n of value head p (nothing past the
// last chunk or head): asked for while the chunk before it is computed, its rows' first loads
// find them in the cache instead of waiting on memory (a head's rows lie H D apart in the
// [B, T, H, D] layout, and waiting on those loads was a sizeable share of the forward's time).
inline void prefetch_inputs(const Sizes& sz, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& beta, const at::Tensor& g,
                            int64_t n, int64_t p) {
  if (n < 0 || n >= sz.N || p < 0 || p >= sz.P) return;
  const int64_t b = p / sz.HV, h = p % sz.HV, hq = sz.qk_head(h), t0 = n * sz.C;
  const int64_t c = std::min<int64_t>(sz.C, sz.T - t0);
  prefetch_rows(q, b, hq, t0 / sz.R, c / sz.R);
  prefetch_rows(k, b, hq, t0, c);
  prefetch_rows(v, b, h, t0, c);
  prefetch_rows(beta, b, h, t0, c);
  prefetch_rows(g, b, h, t0, c);
}

// A thread's ``Staging`` of ``slots`` blocks of C rows for a call's widest row (K, V, or the
// rule's ``input_keys`` K), where ``staged`` (some input is not float32, or its rows lie apart:
// ``any_staged``).
inline Staging staging(const Sizes& sz, int64_t input_keys, int64_t slots, bool staged) {
  const int64_t width = std::max({sz.K, sz.V, input_keys * sz.K, int64_t{1}});
  return Staging(slots, sz.C, width, staged);
}

}  // namespace linattn_native
