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

// One BLAS thread on this thread while alive (MKL's thread-local setting; a no-op with another
// BLAS): the kernels call the BLAS from their own threads (at::parallel_for), and a BLAS that ran
// threads of its own under them would oversubscribe the cores.
struct SequentialBlas {
  int saved;
  SequentialBlas();
  ~SequentialBlas();
};

}  // namespace linattn_native
