// The BLAS that PyTorch links (MKL or OpenBLAS), row-major, with its 32-bit sizes checked.
//
// Every product of the kernels is one call of ``gemm`` on matrices of
// 64 x 64 or so that stay in the L1 and L2 caches. The BLAS takes 32-bit integers: a size or a
// leading dimension beyond that range is refused here, and the entry points copy an input whose
// stride is too large first (``blas_rows``, layout.h).
#pragma once

#include <cstdint>

namespace linattn_native {

// Row-major C[m, n] = alpha op(A) op(B) + beta C, with op(A) [m, k] and op(B) [k, n]; A is stored
// [m, k] (or [k, m] when ta), B [k, n] (or [n, k] when tb).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Products whose left factor or result is lower triangular in each c-column block (column j of a
// block read only at rows i >= j), as a chunk's scores: the rows above the split (``lower_split``,
// half of c) skip the block columns right of it, a quarter of each block's work.
//
// C[m, blocks c] = alpha A B^T + beta C (A [m, k], B [blocks c, k]): each block's columns j <= i
// at row i are written (rows >= the split: all), the others above the split are left as they
// were: the caller masks them.
void lower_products(int64_t m, int64_t c, int64_t blocks, int64_t k, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                    float beta = 0.0f);

// C[m, n] = alpha L U + beta C with L [m, blocks c] zero right of each block's diagonal (L[i, b c
// + j] = 0 for j > i) and U [blocks c, n]: the zero columns are not read.
void lower_times(int64_t m, int64_t c, int64_t blocks, int64_t n, float alpha, const float* L,
                 int64_t ldl, const float* U, int64_t ldu, float beta, float* C, int64_t ldc);

// C[m, n] = alpha L^T U + beta C with L [r, m] lower (L[j, i] = 0 for i > j, as a chunk's scores
// or their gradient, r = m or one row less) and U [r, n]: C's rows from the split on read only
// L's and U's rows from the split on.
void lower_transposed_times(int64_t m, int64_t r, int64_t n, float alpha, const float* L,
                            int64_t ldl, const float* U, int64_t ldu, float beta, float* C,
                            int64_t ldc);

// The factors' gradients of a lower-blocked product M = alpha X Y^T (M [n, blocks c] lower in
// each c-column block, X [n, k], Y [blocks c, k]; n = c or one row less) from its gradient dM,
// masked alike: dX = alpha dM Y + beta_x dX and dY = alpha dM^T X + beta_y dY, block by block
// (``lower_times``, ``lower_transposed_times``). dX and dY may be the same rows (M = alpha X X^T).
void lower_product_gradient(int64_t n, int64_t c, int64_t blocks, int64_t k, float alpha,
                            const float* dM, int64_t ldm, const float* X, int64_t ldx,
                            const float* Y, int64_t ldy, float* dX, int64_t lddx, float beta_x,
                            float* dY, int64_t lddy, float beta_y);

// One BLAS thread on this thread while alive (MKL's thread-local setting; a no-op with another
// BLAS): the kernels call the BLAS from their own threads (at::parallel_for), and a BLAS that ran
// threads of its own under them would oversubscribe the cores.
struct SequentialBlas {
  int saved;
  SequentialBlas();
  ~SequentialBlas();
};

}  // namespace linattn_native
