// The BLAS wrappers of blas.h: row-major calls of the column-major Fortran BLAS.

#include "blas.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
// MKL's thread-local thread count (0: the global one again), the previous value returned: the C
// entry point (``mkl_set_num_threads_local`` is its Fortran twin, taking a pointer). Weak, so
// that the extension loads with any BLAS (nullptr without MKL).
int MKL_Set_Num_Threads_Local(int n) __attribute__((weak));
}

namespace linattn_native {
namespace {

// The BLAS takes 32-bit integers: a size or leading dimension beyond that range is refused (the
// entry points copy an input whose stride is too large, ``blas_rows``; sizes are checked there).
int blas_int(int64_t x) {
  TORCH_CHECK(x >= 0 && x <= INT32_MAX, "linattn_native: ", x,
              " exceeds the BLAS's 32-bit range");
  return static_cast<int>(x);
}

// The leading dimension of a row-major [rows, cols] operand as the BLAS requires it: >= max(1,
// cols). A single row's stride is never read, and may be anything (a 1-token slice of an
// expanded tensor has time stride 0, which the BLAS refuses): it is replaced by max(1, cols).
int blas_ld(int64_t rows, int64_t cols, int64_t ld) {
  const int64_t least = std::max<int64_t>(1, cols);
  if (rows <= 1) return blas_int(least);
  TORCH_CHECK(ld >= least, "linattn_native: a leading dimension ", ld, " < ", least);
  return blas_int(ld);
}

}  // namespace

// Row-major C[m, n] = alpha op(A) op(B) + beta C, with op(A) [m, k] and op(B) [k, n]; A is stored
// [m, k] (or [k, m] when ta), B [k, n] (or [n, k] when tb). The BLAS is column-major, and a
// row-major matrix is its transpose read column-major: C^T = op(B)^T op(A)^T.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const char opa = ta ? 'T' : 'N', opb = tb ? 'T' : 'N';
  const int la = ta ? blas_ld(k, m, lda) : blas_ld(m, k, lda);
  const int lb = tb ? blas_ld(n, k, ldb) : blas_ld(k, n, ldb);
  const int lc = blas_ld(m, n, ldc);
  const int mi = blas_int(m), ni = blas_int(n), ki = blas_int(k);
  sgemm_(&opb, &opa, &ni, &mi, &ki, &alpha, B, &lb, A, &la, &beta, C, &lc);
}

namespace {

// The rows [0, h) of a lower-blocked product that need only the columns [0, h) of each block: h
// = c / 2 rounded down to whole 16-float cache lines (the blocks' columns and rows stay 64-byte
// aligned where c's are), 0 below 32 (one product then).
int64_t lower_split(int64_t m, int64_t c) {
  const int64_t h = c / 32 * 16;
  return std::min(h, m);
}

}  // namespace

void lower_products(int64_t m, int64_t c, int64_t blocks, int64_t k, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, float beta) {
  const int64_t h = lower_split(m, c);
  for (int64_t b = 0; b < blocks && h > 0; ++b) {
    gemm(false, true, h, h, k, alpha, A, lda, B + b * c * ldb, ldb, beta, C + b * c, ldc);
  }
  gemm(false, true, m - h, blocks * c, k, alpha, A + h * lda, lda, B, ldb, beta, C + h * ldc,
       ldc);
}

void lower_times(int64_t m, int64_t c, int64_t blocks, int64_t n, float alpha, const float* L,
                 int64_t ldl, const float* U, int64_t ldu, float beta, float* C, int64_t ldc) {
  const int64_t h = lower_split(m, c);
  for (int64_t b = 0; b < blocks && h > 0; ++b) {
    gemm(false, false, h, n, h, alpha, L + b * c, ldl, U + b * c * ldu, ldu, b == 0 ? beta : 1.0f,
         C, ldc);
  }
  gemm(false, false, m - h, n, blocks * c, alpha, L + h * ldl, ldl, U, ldu, beta, C + h * ldc,
       ldc);
}

void lower_transposed_times(int64_t m, int64_t r, int64_t n, float alpha, const float* L,
                            int64_t ldl, const float* U, int64_t ldu, float beta, float* C,
                            int64_t ldc) {
  const int64_t h = std::min(lower_split(m, m), r);
  gemm(true, false, h, n, r, alpha, L, ldl, U, ldu, beta, C, ldc);
  gemm(true, false, m - h, n, r - h, alpha, L + h * ldl + h, ldl, U + h * ldu, ldu, beta,
       C + h * ldc, ldc);
}

void lower_product_gradient(int64_t n, int64_t c, int64_t blocks, int64_t k, float alpha,
                            const float* dM, int64_t ldm, const float* X, int64_t ldx,
                            const float* Y, int64_t ldy, float* dX, int64_t lddx, float beta_x,
                            float* dY, int64_t lddy, float beta_y) {
  lower_times(n, c, blocks, k, alpha, dM, ldm, Y, ldy, beta_x, dX, lddx);
  for (int64_t b = 0; b < blocks; ++b) {
    lower_transposed_times(c, n, k, alpha, dM + b * c, ldm, X, ldx, beta_y, dY + b * c * lddy,
                           lddy);
  }
}

SequentialBlas::SequentialBlas()
    : saved(MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : 0) {}

SequentialBlas::~SequentialBlas() {
  if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(saved);
}

}  // namespace linattn_native
